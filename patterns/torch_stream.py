"""PyTorch CUDA kernels on TVM's stream, so that a CUDA graph may capture them.

TVM launches its kernels on tvm-ffi's current stream for the device
(``tvm_ffi.get_raw_stream``): the legacy default stream, unless a caller set another, and
a stream of its own while the Relax VM records a CUDA graph
(``vm.builtin.cuda_graph.run_or_capture`` sets it for the capture). PyTorch enqueues on
*its* current stream. ``on_tvm_stream(kernel)`` runs a kernel with TVM's stream as torch's,
so its work is ordered with TVM's kernels, never needs a wait between them, and during a
capture is recorded into the graph (work on the default stream would break the capture).

A captured kernel is not called again: each replay runs the recorded work at the recorded
addresses. So while capturing, the temporaries torch allocates (cuDNN's workspace, a new
stream's cuBLAS workspace) come from a pool kept for captures alone. Freed into torch's
general pool, they would be cached for the capture stream, whose handle a stream made later
may get again, and a tensor allocated there would be overwritten by every replay; the pool
also keeps torch's allocator from querying CUDA events, which a capture forbids. Graphs share
that pool's scratch as TVM's graphs share their storage: they replay one at a time, on one
stream. On the default stream, where nothing is captured, the kernel runs as it is (about
3.5 us less per call on an H100 than switching streams, of about 25 us for an addmm).
"""

from __future__ import annotations

import torch
import tvm_ffi

# A capture runs on a new stream each time: bound the handles kept.
MAX_STREAMS = 64
_streams: dict[tuple[int, int], torch.cuda.Stream] = {}
_devices: dict[int, object] = {}
_capture_pool: list[torch.cuda.MemPool] = []


def tvm_stream(index: int) -> torch.cuda.Stream:
    """TVM's current stream on CUDA device ``index``, as a torch stream (made once per handle)."""
    device = _devices.get(index)
    if device is None:
        device = _devices[index] = tvm_ffi.device("cuda", index)
    raw = tvm_ffi.get_raw_stream(device)
    stream = _streams.get((index, raw))
    if stream is None:
        if len(_streams) >= MAX_STREAMS:
            _streams.clear()
        # 0 is the legacy default stream, which is torch's default stream too.
        stream = torch.cuda.default_stream(index) if raw == 0 else torch.cuda.ExternalStream(raw, device=index)
        _streams[(index, raw)] = stream
    return stream


def capture_pool() -> torch.cuda.MemPool:
    if not _capture_pool:
        _capture_pool.append(torch.cuda.MemPool())
    return _capture_pool[0]


def on_tvm_stream(kernel):
    """``kernel`` (its outputs last, on one CUDA device) run on TVM's current stream."""

    def run(*tensors):
        index = tensors[-1].device.index
        stream = tvm_stream(index)
        if stream.cuda_stream == 0 and torch.cuda.current_stream(index).cuda_stream == 0:
            return kernel(*tensors)  # both on the default stream, which no graph captures: nothing to switch
        with torch.cuda.stream(stream):
            if not torch.cuda.is_current_stream_capturing():
                return kernel(*tensors)
            with torch.cuda.use_mem_pool(capture_pool(), index):
                return kernel(*tensors)

    return run
