"""Backends: one file per library, each exporting its ``BACKEND`` record.

A backend file imports its library lazily (inside ``compile``), so every record loads on
any machine and a missing library shows up as the backend's ``unavailable_reason``.
"""

import importlib

BUILTIN = ("tvm", "dnnl", "mkl", "onnxruntime", "openvino", "cudnn", "cublas", "inductor", "tensorrt")


def builtin_backends() -> list:
    return [importlib.import_module(f"{__name__}.{name}").BACKEND for name in BUILTIN]
