"""Choosing among finalists: which complete placements are timed (``policy``), each engine
alone on the whole model, the user's own file or program included (``engine_alone``),
placements timed end to end for the graph-level search (``end_to_end``), the race and the
choice under the objective (``finalists``), the kept one raced again in fresh processes
(``confirm``), and the race on a fleet's device (``elsewhere``)."""
