"""Choosing among finalists: which complete placements are timed, and which stay (``policy``)."""
