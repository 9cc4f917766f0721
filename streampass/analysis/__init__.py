"""Reading a graph: stream assignment, DAG and happens-before, requirements, verification. Nothing here edits a graph."""
