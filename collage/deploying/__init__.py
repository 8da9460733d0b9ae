"""The optimized module and what a user does with it.

``optimized.OptimizedModule`` is what ``optimize`` returns (callable like ``main``), with its
``report`` and a picture of its placement (``draw``); ``saved`` writes and reads the placement
as JSON, and ``exported`` writes the whole module to a directory and loads it elsewhere.
(``collage.torch_compile``, which makes collage a backend of ``torch.compile``, is an entry
point beside ``api``.)
"""
