"""The optimized module and what a user does with it.

``optimized.OptimizedModule`` is what ``optimize`` returns (callable like ``main``), with its
``report`` and a picture of its placement (``draw``); ``saved`` writes and reads the placement
as JSON, ``exported`` writes the whole module to a directory and loads it elsewhere, and
``torch_compile`` makes collage a backend of ``torch.compile``.
"""
