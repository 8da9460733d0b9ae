"""How many threads the libraries run on, for the whole process.

Each backend's ``compile`` gets its thread count as an argument (ONNX Runtime's and
OpenVINO's sessions take it as an option). Two libraries have only one count per process:
torch's intra-op threads (oneDNN, MKL), and TVM's thread pool, which reads
``TVM_NUM_THREADS`` once, when its first parallel kernel starts it. ``pin_threads`` sets
those two before anything runs, in the optimizing process and in each measuring worker.
How long TVM's idle workers spin (``TVM_SPIN_COUNT``) is set once, by ``import collage``
(``quiet_tvm_workers``), which any import of this module runs first.
"""

from __future__ import annotations

import os


def default_threads() -> int:
    """The cores this process may run on (2 on the development machines)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Yields a TVM pool worker spins for after its task before it sleeps; TVM's default is 300000.
# That is 180 ms on a 2-core Zen 4, a core kept busy after every parallel TVM kernel: the
# user's module compiled whole by inductor then took 9-11 ms a call in place of 0.21-0.31 ms
# (its OpenMP threads waiting at each barrier for the core a spinning worker held), and the
# race kept TVM's placement over it. 100 yields (about 60 us) keeps back-to-back kernels as
# fast as TVM's default does (16-17 us for 256K float32 additions on 2 threads; 40 us for a
# worker woken from sleep every call, with 0).
TVM_SPIN_COUNT = 100


def quiet_tvm_workers() -> None:
    """TVM's idle pool workers to spin ``TVM_SPIN_COUNT`` yields, unless the user chose a
    count: TVM reads it when its pool starts, at the process's first parallel kernel."""
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(TVM_SPIN_COUNT))


def pin_threads(threads: int) -> None:
    """Size TVM's thread pool and torch's intra-op threads to ``threads``.

    Not ``runtime.config_threadpool``: it pins the calling thread to a core, and torch's OpenMP
    threads then share that core with it (a 0.08 ms convolution took 16 ms). TVM's pool is
    sized by the variable only: it is TVM's interface for this, read in this process."""
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
