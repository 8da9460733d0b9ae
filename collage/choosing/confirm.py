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
does. It then overturns the first race's choice on evidence only (``decide``): another
finalist is kept if the kept one is slower than it beyond noise (``Race.verdict``), if it is
equivalent and simpler (the finalists' own rule), or, undecided, if it is as simple and both
its median and its slow blocks are lower. SqueezeNet's race once kept OpenVINO on the user's
file by its upper quartile (2.41 ms against ONNX Runtime alone's 2.47, both noisy), and after
9 undecided rounds in fresh processes (2.48 ms ± 0.06 against 2.33 ± 0.17) kept it still,
0.94x the peer a user would have run. An undecided finalist that is not as simple never
displaces the kept one: mT5's encoder on the Zen 4 without AVX-512 kept ONNX Runtime alone,
and raced again, its op-level placement (ONNX Runtime and OpenVINO) was undecided against it
(1.879 ms ± 0.41 against 1.894 ± 0.31), its upper quartile lower by chance: two libraries'
threads in a user's process for no time measured. Nor is a simpler one slower by its median
kept for its simplicity (DAC's, in ``decide``). The report says what this race showed,
either way.
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
            why = f" ({self.verdict}; {self.tie_broken_by})" if self.tie_broken_by else ""
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
    chosen, why = decide(race, kept, others, {n: finalists[n].simplicity for n in (kept, *others)})
    second = fastest() if chosen == kept else chosen
    result.runner_up, result.verdict, result.tie_broken_by = str(second), race.verdict(kept, second).value, why
    if chosen != kept:
        result.kept, result.runner_up, result.switched = str(chosen), str(kept), True
    return result


def _unsendable(name, finalist: Finalist) -> str | None:
    """Why finalist ``name`` cannot be rebuilt in a fresh process, or None."""
    unknown = {p.backend for p in finalist.partitions} - set(default_backends().names())
    if unknown:
        return f"{', '.join(sorted(unknown))} not registered for a fresh process"
    if any(p.pattern.endswith(PROGRAM_SUFFIX) for p in finalist.partitions):
        return f"'{name}' compiles the user's PyTorch module, which is not sent to another process"
    return None


def decide(race: Race, kept, others: list, simplicity: dict) -> tuple[object, str | None]:
    """The finalist to keep after the fresh processes' race of ``kept`` and ``others``, and
    what decided it where the race left ``kept`` undecided. The race overturns the optimizing
    process's choice on evidence only:

    - a finalist ``kept`` is slower than beyond noise (``Race.verdict``) is kept instead, the
      one whose slow blocks cost least (``Race.paid_ms``) if several are;
    - else one equivalent to ``kept`` and simpler (``simplicity``: ``Finalist.simplicity``),
      by the finalists' own rule (``finalists.choose``);
    - else one undecided against ``kept``, as simple, with both its median and its slow blocks
      lower (SqueezeNet's ONNX Runtime alone: 2.33 ms ± 0.17 against OpenVINO alone's steady
      2.48);
    - else ``kept`` stays. An undecided runner-up simpler but slower by its median is not
      kept: DAC's op-level placement (13.2 ms), raced beside ONNX Runtime alone (15.3 ± 2.0)
      and OpenVINO alone (13.7 ± 5.6), gave way to ONNX Runtime alone, the slowest of the
      three, when the two simpler were judged each against it alone by their slow blocks and
      simplicity first."""
    faster = [name for name in others if race.verdict(kept, name) is Verdict.SLOWER]
    if faster:
        return min(faster, key=race.paid_ms), None
    equivalent = [name for name in others
                  if race.verdict(name, kept) is Verdict.EQUIVALENT and simplicity[name] < simplicity[kept]]  # fmt: skip
    if equivalent:
        return simplest(equivalent, simplicity, {name: race.paid_ms(name) for name in equivalent}), "simpler"
    median = lambda name: race.cost(name).median_ms  # noqa: E731
    better = [name for name in others
              if race.verdict(name, kept) is Verdict.UNDECIDED and simplicity[name] <= simplicity[kept]
              and median(name) < median(kept) and race.paid_ms(name) < race.paid_ms(kept)]  # fmt: skip
    if better:
        return min(better, key=race.paid_ms), "as simple, its median and slow blocks both lower"
    undecided = any(race.verdict(kept, name) is Verdict.UNDECIDED for name in others)
    return kept, "no other as simple with its median and slow blocks both lower" if undecided else None


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
