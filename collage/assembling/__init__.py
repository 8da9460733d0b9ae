"""A placement becomes one module that runs and computes what the unoptimized one does.

``assemble`` rewrites ``main`` once, partition by partition (TVM's groups as Primitive
functions TVM fuses, every other library's kernel called through ``call_dps_packed``);
``checked`` compares it with the unoptimized module and falls wrong partitions back to TVM.
"""
