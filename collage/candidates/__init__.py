"""What each backend can run on this model: the candidates.

A ``backend.Backend`` record says what a library runs (``pattern``: dpl patterns, and pattern
rules of a ``valid_op`` and a ``fusion_rule``) and how it compiles a sub-graph; ``generate``
finds every legal use of them on the graph (pattern matches, groups grown by the rules, an
engine's largest regions and their parts), each a ``Candidate``: a ``subgraph.SubGraph``
(a frozen set of binding indices, connected and convex) on one backend. ``onnx_convert``
turns a sub-graph into the ONNX an inference engine reads, and says which operators it can.
"""
