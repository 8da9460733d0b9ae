"""Precision as a dimension of a candidate: which number formats a library may run a
sub-graph in, here.

Collage computes in float32 unless the user gives an accuracy budget (``Config.accuracy``).
With one, a backend that declares reduced precisions (``Backend.precisions``) offers each of
its candidates in them too; the budget then decides, by measurement, which are kept
(``choosing.finalists``). bfloat16 is offered only where the CPU computes it natively
(AVX512_BF16 or AMX): elsewhere a library converts it in software, slower than float32.
int8 (weights quantized ahead, activations at run time) is offered where the CPU has
integer dot products libraries use (AVX2; VNNI makes them faster). On a GPU, TF32 is offered
by the libraries that run float32 on tensor cores (cuDNN, cuBLAS, inductor), bfloat16 and
float16 by inductor (``torch.autocast``): the same tensor-core speed, float16 with 10 bits of
mantissa where bfloat16 has 7, so within a budget more often, bfloat16 with float32's range:
a candidate is measured in bfloat16 only where float16 misses (``MEASURED_ONLY_AFTER``).
"""

from __future__ import annotations

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
FLOAT16 = "float16"
INT8 = "int8"
# float32 tensors multiplied on tensor cores with 10-bit mantissas (NVIDIA's TF32), summed in
# float32: cuDNN's and cuBLAS's float32 kernels where the caller allows it (Ampere and later).
TF32 = "tfloat32"
# bfloat16 and float16 run on tensor cores (and AMX-FP16) at one speed and move as many bytes;
# float16 keeps 10 bits of mantissa where bfloat16 keeps 7. So bfloat16 can win only where
# float16's range (to 65504) is too small: where a backend offers both, a candidate is measured
# in bfloat16 only after its float16 twin missed the budget or failed (``measuring.measure``).
MEASURED_ONLY_AFTER = {BFLOAT16: FLOAT16}
# The CPU flags (as /proc/cpuinfo spells them) under which bfloat16 is native.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_unavailable(isa: list[str] | tuple[str, ...]) -> str | None:
    """Why this CPU (its ``isa`` flags, ``measuring.cost.cpu_info()["isa"]``) has no native
    bfloat16, or None when it has."""
    if any(flag in isa for flag in NATIVE_BF16_FLAGS):
        return None
    return f"this CPU has neither AVX512_BF16 nor AMX (flags: {' '.join(isa) or 'none of note'})"


def amx_unavailable(isa: list[str] | tuple[str, ...]) -> str | None:
    """Why oneDNN's float32 math mode would not compute in bfloat16 on this CPU, or None: it
    takes bfloat16 kernels only on AMX, and on AVX512_BF16 alone keeps its float32 ones
    (ONEDNN_VERBOSE on a Zen 5: jit:avx512_core and brg_matmul:avx512_core, results to the bit)."""
    if "amx_bf16" in isa:
        return None
    return f"oneDNN computes in bfloat16 through its float32 math mode only on AMX, which this CPU lacks (flags: {' '.join(isa) or 'none of note'})"


def int8_unavailable(isa: list[str] | tuple[str, ...]) -> str | None:
    """Why this CPU has no integer dot products a library's int8 kernels use, or None."""
    return None if "avx2" in isa else "this CPU has no AVX2 for int8 kernels"


def reduced(partitions) -> bool:
    """Whether any of ``partitions`` (``placement.Partition``) computes in a reduced precision."""
    return any(p.candidate.precision != FLOAT32 for p in partitions)


def precision_argument(precision: str) -> dict:
    """The ``precision=`` keyword a backend's compile function gets: only for a reduced
    precision, so a backend that offers none is never passed one (``Backend.precisions``)."""
    return {} if precision == FLOAT32 else {"precision": precision}


def short(precision: str) -> str:
    """The short name reports use: f32, bf16, f16, tf32, int8."""
    return {FLOAT32: "f32", BFLOAT16: "bf16", FLOAT16: "f16", TF32: "tf32"}.get(precision, precision)
