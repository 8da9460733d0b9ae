"""collage-tvm: automated multi-backend placement for Apache TVM Relax."""

from collage.backend import GRAPH_LEVEL, OP_LEVEL, Backend, list_backends, register_backend  # noqa: F401
from collage.pattern import Pattern, PatternRule  # noqa: F401
from collage.simplify import simplify  # noqa: F401
