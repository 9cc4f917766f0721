"""Editing a graph: the sync planner, the edit that applies a plan (all or nothing), the passes. The only code that changes a graph."""
