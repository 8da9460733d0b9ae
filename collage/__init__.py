"""collage-tvm: automated multi-backend placement for Apache TVM Relax."""

from collage.api import load_placement, optimize  # noqa: F401
from collage.errors import OptimizeError  # noqa: F401
from collage.optimized import OptimizedModule  # noqa: F401
from collage.backend import GRAPH_LEVEL, OP_LEVEL, Backend, list_backends, register_backend  # noqa: F401
from collage.cost_log import CostLog  # noqa: F401
from collage.exported import ExportError, ExportedModule, load  # noqa: F401
from collage.frontend import ModelImportError, load_onnx  # noqa: F401
from collage.pattern import Pattern, PatternRule  # noqa: F401
from collage.saved import PlacementFileError, save_placement  # noqa: F401
from collage.simplify import simplify  # noqa: F401
