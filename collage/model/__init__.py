"""The model, from what the user hands over to a graph to place.

``frontend`` imports it (a Relax module, an ONNX file, a torch module through torch.export);
``simplify`` is a fixed point of TVM's passes and small dpl rewrites; ``graph`` is the
indexed, read-only view of ``main``'s dataflow that the candidates, the placement and the
assembly index into. Binding the weights, gathering the backends and the cost log, and the
reference outputs every assembled module is checked against are ``collage.prepare``, which
reads the settings and the measuring stage, so it comes after them.
"""
