"""Automatic stream assignment: choose where each compute node runs (docs/assign.md).

Pure analysis: it reads the graph, prices candidates on annotated copies with
``streampass.run`` and the simulator, and returns a
:class:`~streampass.assign.choose.StreamChoice`; ``choice.apply(gm)`` (which calls
``transform.assign_apply``) writes it as ``custom.stream`` annotations.
"""
