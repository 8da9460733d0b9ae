"""How many threads the libraries run on, for the whole process.

Each backend's ``compile`` gets its thread count as an argument (ONNX Runtime's and
OpenVINO's sessions take it as an option). Two libraries have only one count per process:
torch's intra-op threads (oneDNN, MKL), and TVM's thread pool, which reads
``TVM_NUM_THREADS`` once, when its first parallel kernel starts it. ``pin_threads`` sets
those two before anything runs, in the optimizing process and in each measuring worker.
"""

from __future__ import annotations

import os


def default_threads() -> int:
    """The cores this process may run on (2 on the development machines)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pin_threads(threads: int) -> None:
    """Size TVM's thread pool and torch's intra-op threads to ``threads``.

    Not ``runtime.config_threadpool``: it pins the calling thread to a core, and torch's OpenMP
    threads then share that core with it (a 0.08 ms convolution took 16 ms). TVM's pool is
    sized by the variable only: it is TVM's interface for this, read in this process."""
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
