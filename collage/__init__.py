"""collage-tvm: automated multi-backend placement for Apache TVM Relax."""

from collage.measuring.threads import quiet_tvm_workers

quiet_tvm_workers()  # before anything collage runs starts TVM's thread pool

from collage.api import load_placement, optimize  # noqa: F401
from collage.errors import OptimizeError  # noqa: F401
from collage.deploying.optimized import OptimizedModule  # noqa: F401
from collage.candidates.backend import GRAPH_LEVEL, OP_LEVEL, Backend, list_backends, register_backend  # noqa: F401
from collage.measuring.cost_log import CostLog  # noqa: F401
from collage.measuring.rpc_runner import FleetError, RPCRunner  # noqa: F401
from collage.deploying.exported import ExportError, ExportedModule, load  # noqa: F401
from collage.model.frontend import ModelImportError, load_onnx  # noqa: F401
from collage.candidates.pattern import Pattern, PatternRule  # noqa: F401
from collage.deploying.saved import PlacementFileError, save_placement  # noqa: F401
from collage.model.simplify import simplify  # noqa: F401

from collage.backends import builtin_backends
from collage.candidates import backend as _registry

# The registry sits below the backend files, which import it: the package hands it the built-ins.
_registry.provide_builtins(builtin_backends)
