"""The kept finalist raced once more against the close runners-up, each in a fresh process of its own.

The finalists' race runs in the optimizing process, where every finalist's libraries are
loaded and their thread pools alive, and where the measuring left its caches and allocators
as they are. A user's process runs the kept module alone, and the two can disagree: on a
2-core Zen 4 (family 25 model 17) the race timed a MobileNetV2-style CNN at 0.412 ms on
OpenVINO alone and 0.408 on ONNX Runtime alone, and kept OpenVINO; raced as their users run
them, ONNX Runtime ran it in 0.350 ms and OpenVINO in 0.44-0.46.

The swap is not only between the first two: BLOOM's race there (the same Zen 4, without
AVX-512) timed the op-level placement at 1.93 ms, OpenVINO alone at 1.94 and ONNX Runtime
alone at 2.08, and raced only the first two again (OpenVINO kept, twice); run as their users
run them, ONNX Runtime took 2.04 ms and OpenVINO 2.47.

So every runner-up that came close (``CLOSE``), the nearest ``MAX_RUNNERS_UP`` of them, and
the kept finalist are each rebuilt in a worker process started for it alone (as
``collage.load_placement`` rebuilds a placement: ``elsewhere.built_here``), and timed block by
block with the project's protocol: a fresh random order each round, a settling pause before
each block, the other processes idle meanwhile. This race decides, so it goes on while the
kept one and the fastest other are undecided, up to ``MAX_ROUNDS`` as the finalists' race
does (``decide``). If that other is then faster beyond noise (``Race.verdict``), it is kept
instead. If the two are still undecided, the tie is broken by the finalists' own rule
(``finalists.choose``): the simpler (fewer libraries, then partitions), then the one whose
slow blocks cost a user less. SqueezeNet's race once kept OpenVINO on the user's file by its
upper quartile (2.41 ms against ONNX Runtime alone's 2.47, both noisy), and after 9 undecided
rounds in fresh processes (2.48 ms ± 0.06 against 2.33 ± 0.17) kept it still, 0.94x the peer a
user would have run. Simplicity comes first as in that rule: mT5's encoder on the Zen 4 without
AVX-512 kept ONNX Runtime alone, its op-level placement (ONNX Runtime and OpenVINO) slower in
the optimizing process's race; raced again, the two were undecided (1.879 ms ± 0.41 against
1.894 ± 0.31), and the op-level placement, its upper quartile lower by chance, was kept: two
libraries' threads in a user's process for no time measured. The report says what this race
showed, either way.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..candidates.backend import default_backends
from ..candidates.generate import PROGRAM_SUFFIX
from ..measuring.cost import Cost
from ..measuring.isolation import WorkerProcess
from ..measuring.build import is_cuda, kernel_backends, module_cuda_graph_blocker
from ..errors import first_line
from ..measuring.timing import Protocol, block_calls, settle, timed_block
from ..measuring.wire import unpack
from . import elsewhere
from ..assembling.checked import Finalist
from .finalists import MAX_ROUNDS, Race, Verdict, simplest, users_call

# Raced again only when the runner-up's paid time is within this share of the kept one's:
# farther apart, the conditions of the two races were never seen to swap them. None: never.
CLOSE: float | None = 0.25
# At most this many runners-up besides the kept one, the nearest first: a process each, whose
# libraries' start and build take seconds, and a block each per round.
MAX_RUNNERS_UP = 2
PROTOCOL = Protocol(rounds=9, block_ms=60.0, settle_s=0.1)
BUILD_TIMEOUT_S = 600.0  # a worker's start (it imports every library) and an engine compiling a whole model
BLOCK_TIMEOUT_S = 120.0


@dataclass
class Confirmation:
    """What the race in fresh processes showed: each finalist's cost there, which was kept
    afterwards, and the verdict of the kept one against the fastest other, ``runner_up``
    (``Verdict``'s value), or why it was not raced (``skipped``)."""

    kept: str
    runner_up: str
    costs: dict[str, Cost] = field(default_factory=dict)
    verdict: str = ""
    switched: bool = False
    skipped: str | None = None
    tie_broken_by: str | None = None  # what decided an undecided race (``decide``)

    def line(self) -> str:
        if self.skipped is not None:
            return f"not raced again in fresh processes: {self.skipped}"
        ms = ", ".join(f"'{name}' {cost.median_ms:.3f} ms ± {cost.spread_ms:.3f}" for name, cost in self.costs.items())
        if self.switched:
            why = f" (undecided; {self.tie_broken_by})" if self.tie_broken_by else ""
            return f"raced again, each in a fresh process: {ms}; kept '{self.kept}' instead of '{self.runner_up}'{why}"
        why = f" ({self.tie_broken_by})" if self.tie_broken_by else ""
        return f"raced again, each in a fresh process: {ms}; '{self.kept}' {self.verdict} against '{self.runner_up}', kept{why}"


def runners_up(race: Race, finalists: dict, kept) -> list:
    """The finalists after ``kept`` by the race's paid time that came within ``CLOSE`` of it,
    the nearest first, at most ``MAX_RUNNERS_UP``."""
    if CLOSE is None:
        return []
    others = sorted((name for name in finalists if name != kept and race.blocks(name)), key=race.paid_ms)
    return [name for name in others if race.paid_ms(name) <= (1 + CLOSE) * race.paid_ms(kept)][:MAX_RUNNERS_UP]


def needless(finalists: dict, names, target: str, backends) -> str | None:
    """Why racing ``names`` (in ``finalists``) again in fresh processes would tell nothing the
    finalists' race did not, or None. What this race guards against is the optimizing
    process's host: CPU libraries' threads, alive and spinning beside the finalist timed. On
    a GPU, a finalist whose every kernel is graph-safe runs as CUDA graphs replayed, its
    time the device's, which those threads do not slow: ResNet-50, BERT-base, GPT-2 and
    ConvNeXt-T on an H100, raced again so, each timed within 3% of the finalists' race and
    in the same order; ViT-B's two races took 126 s of its 193 s optimization on an H200."""
    if not is_cuda(target):
        return None
    for name in names:
        assembly = finalists[name].assembly
        if module_cuda_graph_blocker(assembly.module, kernel_backends(assembly, backends)) is not None:
            return None  # launched kernel by kernel from the host, as on a CPU
    return "on the GPU they run as CUDA graphs, their time the device's, which this process's host threads do not slow"


def confirm(finalists: dict, kept, others: list, request: Callable[[object], bytes], threads: int,
            seed: int = 0) -> Confirmation:  # fmt: skip
    """``kept`` and ``others`` (names in ``finalists``) raced each in a worker process of its
    own; ``request(name)`` is that finalist alone as ``elsewhere.request`` bytes, made only
    for a race that runs. An other that cannot be sent is left out; ``kept`` then raced
    against the rest. Never raises: a race that cannot run says why (``skipped``)."""
    result = Confirmation(str(kept), str(others[0]))
    sent = {name: _unsendable(name, finalists[name]) for name in (kept, *others)}
    others = [name for name in others if sent[name] is None]
    if sent[kept] is not None or not others:
        result.skipped = next(why for why in sent.values() if why is not None)
        return result
    workers = {name: WorkerProcess(threads) for name in (kept, *others)}
    for worker in workers.values():
        worker.start()  # all import their libraries at once
    try:
        for name, worker in workers.items():  # all build at once: seconds to minutes each
            worker.submit(functools.partial(_hold, request(name), threads), BUILD_TIMEOUT_S)
        for name, worker in workers.items():
            why = worker.result()
            if why is not None:
                result.skipped = f"'{name}' could not be rebuilt there: {why}"
                return result
        race = Race()
        order = random.Random(seed)
        fastest = lambda: min(others, key=race.paid_ms)  # noqa: E731
        while len(race.rounds) < PROTOCOL.rounds or (
            race.verdict(kept, fastest()) is Verdict.UNDECIDED and len(race.rounds) < MAX_ROUNDS
        ):
            blocks = {}
            for name in order.sample(list(workers), len(workers)):
                time.sleep(PROTOCOL.settle_s)
                blocks[name] = workers[name].call(_block, BLOCK_TIMEOUT_S)
            race.rounds.append(blocks)
    except RuntimeError as err:  # a worker died or overran
        result.skipped = f"a worker failed: {first_line(err)}"
        return result
    finally:
        for worker in workers.values():
            worker.close()
    result.costs = {str(name): race.cost(name) for name in (kept, *others)}
    second = fastest()
    verdict, switch, result.tie_broken_by = decide(race, kept, second, {n: finalists[n].simplicity for n in (kept, second)})
    result.runner_up, result.verdict = str(second), verdict.value
    if switch:
        result.kept, result.runner_up, result.switched = str(second), str(kept), True
    return result


def _unsendable(name, finalist: Finalist) -> str | None:
    """Why finalist ``name`` cannot be rebuilt in a fresh process, or None."""
    unknown = {p.backend for p in finalist.partitions} - set(default_backends().names())
    if unknown:
        return f"{', '.join(sorted(unknown))} not registered for a fresh process"
    if any(p.pattern.endswith(PROGRAM_SUFFIX) for p in finalist.partitions):
        return f"'{name}' compiles the user's PyTorch module, which is not sent to another process"
    return None


def decide(race: Race, kept, second, simplicity: dict) -> tuple[Verdict, bool, str | None]:
    """``kept``'s verdict against ``second`` in the fresh processes' race, whether ``second``
    is kept instead, and what broke the tie if they are undecided. ``second`` is kept when
    ``kept`` is slower beyond noise, or when the two are undecided and ``second`` comes first
    by the finalists' rule (``finalists.choose``): the simpler (``simplicity``: name to
    ``Finalist.simplicity``), then the one whose slow blocks cost a user less
    (``Race.paid_ms``)."""
    verdict = race.verdict(kept, second)
    if verdict is not Verdict.UNDECIDED:
        return verdict, verdict is Verdict.SLOWER, None
    first = simplest((kept, second), simplicity, {name: race.paid_ms(name) for name in (kept, second)})
    why = "simpler" if simplicity[kept] != simplicity[second] else "its slow blocks cost less"
    return verdict, first == second, why


# -- in the worker: one finalist, held between calls

_HELD: dict = {}


def _hold(data: bytes, threads: int) -> str | None:
    """Build the one finalist of ``data`` and keep it ready to time; why not, if it cannot be
    built as it was sent (a partition that falls back to TVM here is another module)."""
    header, arrays = unpack(data)
    sent = elsewhere.built_here(header, arrays, default_backends(), threads)
    if sent.left_out or sent.ran:
        return "; ".join([*sent.left_out.values(), *(f"{label} fell back to tvm" for label in sent.ran)])
    (finalist,) = sent.built.values()
    target = header["target"]
    call = users_call(finalist, sent.inputs, target)
    _HELD.update(finalist=finalist, call=call, calls=block_calls(call, PROTOCOL))
    return None


def _block() -> float:
    """The median call (ms) of one block of the held finalist, returned once this process's
    threads are idle again (``settle``): the other finalist's block runs next, beside it."""
    median = statistics.median(timed_block(_HELD["call"], _HELD["calls"]))
    settle(0.0)
    return median


def request_for(name, finalists: dict[object, Finalist], module, steps: dict, onnx_model, reference,
                target: str, accuracy) -> bytes:  # fmt: skip
    """Finalist ``name`` alone as a race request (``elsewhere.request``)."""
    return elsewhere.request({str(name): finalists[name]}, module, {str(name): steps.get(name) or []},
                             onnx_model, reference, target, accuracy, metered=False)
