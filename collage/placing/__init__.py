"""From measured costs to the placements worth timing, and the choice among them.

``placement.place`` is Collage's dynamic programming over the candidates; ``offload``,
``evolve``, ``end_to_end`` and ``refine`` are the graph-level search over what to hand to an
inference engine (DEAP, each placement timed end to end); ``substitute`` searches graph
rewrites jointly with the placement (MetaFlow); ``engine_alone`` runs an engine on the whole
model, the user's own ONNX file included; ``finalists`` times the complete placements against
each other and chooses under the ``objective``.
"""
