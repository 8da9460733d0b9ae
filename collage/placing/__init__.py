"""From measured costs to the placements worth timing.

``placement.place`` is Collage's dynamic programming over the candidates; ``offload``,
``evolve`` and ``refine`` are the graph-level search over what to hand to an inference engine
(DEAP), each placement's fitness handed in by the caller (``refine.PlacementLatency``: timed
end to end in ``choosing``); ``substitute`` searches graph rewrites jointly with the placement
(MetaFlow); ``recorded`` is a placement as data (a saved file, a fleet's race request);
``objective`` is what the finalists are chosen by.
"""
