"""The model, from what the user hands over to what every stage takes.

``frontend`` imports it (a Relax module, an ONNX file, a torch module through torch.export);
``prepare`` binds its weights, checks its inputs are static tensors, simplifies it
(``simplify``: a fixed point of TVM's passes and small dpl rewrites), gathers the backends and
the cost log, and draws the seeded inputs and the reference outputs every assembled module is
checked against; ``graph`` is the indexed, read-only view of ``main``'s dataflow that the
candidates, the placement and the assembly index into.
"""
