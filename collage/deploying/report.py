"""The readable report of an optimized module: what runs where, and what it costs."""

from __future__ import annotations

import math
from typing import NamedTuple

from ..candidates.precision import FLOAT32, short
from ..choosing.finalists import MAX_OTHERS_BUSY
from ..measuring.timing import CEILING_FLOOR_MS
from ..record import AS_GIVEN, OP_LEVEL, FinalistKind, FinalistName, FinalistResult, RunRecord

MAX_OPS_SHOWN = 4
# A TVM partition taking more than this share of the model's time, untuned, is worth a warning.
DOMINANT_SHARE = 0.5


def short_op(op: str) -> str:
    return op.removeprefix("relax.").removeprefix("nn.")


def ops_text(ops: list[str]) -> str:
    shown = ", ".join(short_op(op) for op in ops[:MAX_OPS_SHOWN])
    return shown + (f", ... ({len(ops)} ops)" if len(ops) > MAX_OPS_SHOWN else "")


class BackendTotal(NamedTuple):
    partitions: int
    ops: int
    ms: float  # estimated; a partition never measured (a fallback) counts zero


def backend_totals(partitions) -> dict[str, BackendTotal]:
    """Each backend's partitions, ops and estimated ms, the most time first."""
    totals: dict[str, BackendTotal] = {}
    for p in partitions:
        n, ops, ms = totals.get(p.backend, BackendTotal(0, 0, 0.0))
        totals[p.backend] = BackendTotal(n + 1, ops + len(p.nodes), ms + (0.0 if math.isnan(p.cost_ms) else p.cost_ms))
    return dict(sorted(totals.items(), key=lambda kv: -kv[1].ms))


def dominant_tvm_ops(partitions) -> list[str]:
    """Warnings for TVM partitions that take most of the estimated time: TVM's default
    pipeline does not tune its kernels, so one op no library takes can cost more than the rest
    of the model (EfficientNet's ceil-mode average pool once took 384 ms of 386)."""
    total = sum(p.cost_ms for p in partitions if math.isfinite(p.cost_ms))
    return [
        f"{p.cost_ms / total:.0%} of the estimated time ({p.cost_ms:.3g} ms) is "
        f"{', '.join(sorted(set(p.ops)))} left to TVM untuned (nodes {sorted(p.nodes)[:8]}): no other backend took it"
        for p in partitions
        if p.backend == "tvm" and math.isfinite(p.cost_ms) and total > 0 and p.cost_ms > DOMINANT_SHARE * total
    ]


def _stages_text(seconds) -> str:
    """Each stage's seconds (``StageSeconds``); those a run may skip only where it ran them."""
    stages = [("preparing", seconds.prepare), ("generating", seconds.generate), ("measuring", seconds.measure),
              ("the substitution search", seconds.substitute), ("placing", seconds.place),
              ("assembling and checking", seconds.assemble), ("the graph-level search", seconds.graph_level),
              ("timing the finalists", seconds.final_timing)]  # fmt: skip
    optional = {"the substitution search", "the graph-level search"}
    return ", ".join(f"{name} {s:.1f} s" for name, s in stages if s >= 0.05 or name not in optional)


def measuring_text(r) -> str | None:
    """Where measuring's time went (a ``RunRecord``'s): each backend's candidates (and how
    much of it compiling), the model's values and the compile pool; None when nothing was
    measured."""
    parts = []
    for backend, seconds in sorted(r.measuring_by_backend.items(), key=lambda kv: -kv[1]):
        compiling = r.compiling_by_backend.get(backend, 0.0)
        parts.append(f"{backend} {seconds:.1f} s" + (f" ({compiling:.1f} compiling)" if compiling >= 0.05 else ""))
    if r.values_s:
        parts.append(f"the model's values {r.values_s:.1f} s")
    warmed = r.compiled_ahead
    if warmed.compiled:
        parts.append(f"compiling {warmed.compiled} candidate(s) ahead {warmed.seconds:.1f} s ({warmed.processes} processes, "
                     f"the slowest {warmed.slowest_s:.1f} s, {warmed.slowest_ops} ops, "
                     f"{warmed.slowest_threads} compile thread(s)"
                     + ("; TVM's candidates measured meanwhile)" if warmed.measured_meanwhile else ")"))
    parts += [f"compiling ahead, {said}" for said in warmed.warnings]
    return f"measuring's {r.seconds.measure:.1f} s: {', '.join(parts)}" if parts else None


def _skipped_text(skipped: dict[str, int]) -> str:
    """The candidates the search bound left unmeasured (``measure.SearchBound``), by rule."""
    if not skipped:
        return ""
    return f"{sum(skipped.values())} not measured ({'; '.join(f'{n}: {rule}' for rule, n in skipped.items())}), "


def _timed_once_text(timed_once: int) -> str:
    """Candidates timed by one call: no placement using one could beat the cheapest
    whole-model candidate (``Timing.ceiling_ms``)."""
    if not timed_once:
        return ""
    return f" ({timed_once} by one call: over twice the cheapest whole-model candidate, and {CEILING_FLOOR_MS:g} ms)"


def _timed_out_text(timed_out: int) -> str:
    """Candidates that overran the worker's deadline: a busy machine can cause it as well as a
    hanging library, so they are not logged and are measured again next time."""
    return f"{timed_out} timed out (not logged: measured again next time), " if timed_out else ""


def graph_level_text(g: dict, finalists: dict[FinalistName, FinalistResult]) -> str:
    """The graph-level search in a few lines, with the op-level and refined latencies side by side."""
    if "skipped" in g:
        return f"graph-level refinement skipped: {g['skipped']}"
    op_level = finalists[OP_LEVEL].measured.median_ms if OP_LEVEL in finalists else math.nan
    refined = [f.measured.median_ms for name, f in finalists.items() if name.kind is FinalistKind.GRAPH_LEVEL]
    best = min(refined) if refined else math.nan
    return "\n".join([
        (
            f"graph-level refinement ({g['engine']}): {g['units']} units, {g['generations']} generations, "
            f"{g['placements']} placements ({g['measured_now']} measured now), {g['search_s']:.0f} s, "
            f"stopped by {g['stopped']}"
        ),
        (
            f"  op-level {op_level:.3f} ms -> refined {best:.3f} ms ({op_level / best:.2f}x), timed together; "
            f"during the search: start {g['start_ms']:.3f} ms, all on {g['engine']} {g['all_on_engine_ms']:.3f} ms, "
            f"best {g['best_ms']:.3f} ms"
        ),
    ])


def substitutions_text(found: dict, kept: bool) -> str:
    """The substitution search in two lines: what it explored and what it found."""
    rules = ", ".join(f"{rule} x{n}" for rule, n in found["rules_applied"].items()) or "none"
    failed = "".join(f"; {rule} failed: {why}" for rule, why in found.get("failed", {}).items())
    return "\n".join([
        (
            f"graph substitutions (alpha {found['alpha']}, objective {found.get('objective', 'time')}): {found['explored']} graphs expanded, {found['costed']} priced, "
            f"{found['pruned']} pruned by alpha, {found['measured_now']} candidates measured now, "
            f"{found['seconds']:.1f} s, stopped: {found['stopped_by']}{failed}"
        ),
        (
            f"  rules applied: {rules}; {_objective_text(found)}; "
            + ("the substituted graph was kept" if kept else "the graph as given was kept")
        ),
    ])


def _objective_text(found: dict) -> str:
    """The search's estimate before and after: ms for time, else the objective relative to the
    graph as given (1.0)."""
    if found.get("objective", "time") == "time":
        return f"estimated {found['initial_cost']:.3f} ms -> {found['best_cost']:.3f} ms"
    return f"{found['objective']} (the graph as given = 1): {found['initial_cost']:.3f} -> {found['best_cost']:.3f}"


def _ms(value: float) -> str:
    return f"{value:.3f} ms" if math.isfinite(value) else "- (a kernel never timed alone)"


def format_report(opt) -> str:
    """Partitions, each backend's share of the estimated time, estimated vs measured end to
    end, what simplification did, and what was left out and why."""
    parts = opt.placement
    lines = [
        (
            f"collage placement: {len(parts)} partitions over {sum(len(p.nodes) for p in parts)} operators, "
            f"target {opt.target}, {opt.threads} thread(s)"
        ),
        "",
        f"{'#':>3}  {'backend':<12} {'pattern':<26} {'ms':>9}  ops",
    ]
    r: RunRecord = opt.record
    if r.optimized_for is not None:
        lines[1:1] = [f"optimized for {r.optimized_for}, the device of the fleet that measured it, not this machine "
                      f"({r.not_here}); finalists timed on {r.timed_on or 'it'}"]  # fmt: skip
        if r.graph_level is not None and "skipped" not in r.graph_level:
            lines[2:2] = ["  (the graph-level search timed the placements it tried here; its leaders raced there)"]
    if r.unplaced is not None:
        lines.append(f"    nothing placed: {r.unplaced}; the whole model runs on tvm, as TVM alone runs it")
    if r.not_imported is not None:
        runs = "it runs as given" if r.chosen == AS_GIVEN else "an engine runs it whole"
        lines.append(f"    TVM cannot import the model ({r.not_imported}): {runs}")
    for k, p in enumerate(parts):
        cost = "-" if math.isnan(p.cost_ms) else f"{p.cost_ms:9.4f}"
        pattern = p.pattern if p.candidate.precision == FLOAT32 else f"{p.pattern} [{precision_text(p)}]"
        lines.append(f"{k:>3}  {p.backend:<12} {pattern:<26} {cost:>9}  {ops_text(p.ops)}")

    share = backend_totals(parts)
    total = sum(t.ms for t in share.values()) or 1.0
    lines += ["", "time by backend (estimated):", f"  {'backend':<12} {'partitions':>10} {'ops':>5} {'ms':>9} {'share':>6}"]
    for backend, (n, ops, ms) in share.items():
        lines.append(f"  {backend:<12} {n:>10} {ops:>5} {ms:9.3f} {ms / total:6.1%}")

    m = opt.measured
    lines += [
        "",
        (
            f"end to end: estimated {_ms(opt.estimated_ms)} (sum of measured kernels and transitions), "
            f"measured {m.median_ms:.3f} ms ± {m.spread_ms:.2g} (median of {m.samples})"
        ),
    ]
    if r.accuracy is not None:
        kept = r.finalists.get(r.chosen)
        error = f"the kept module's error is {kept.error:.3g}" if kept is not None and kept.error is not None else ""
        lines.append(f"accuracy budget {r.accuracy:g} of each output's largest magnitude: {error or 'not measured'}"
                     f" (largest over the seeded inputs and {_budget_sets(r.calibration_sets)})")  # fmt: skip
        if r.precision_note:
            lines.append(f"  {r.precision_note}")
    if len(r.finalists) > 1:
        lines += ["", f"placements timed end to end ({_choice_rule(r)}):"]
        for name, f in r.finalists.items():
            mark = "  <- kept" if name == r.chosen else ""
            estimated = "-" if not math.isfinite(f.estimated_ms) else f"{f.estimated_ms:.3f}"
            m = f.measured
            paid = f", upper quartile {f.paid_ms:.3f} over {m.samples} rounds ({f.verdict})" if f.paid_ms is not None else ""
            energy = f", {m.energy_mj:.3g} mJ" if m.energy_mj is not None else ""
            lines.append(
                f"  {str(name):<30} estimated {estimated:>9} ms, measured {m.median_ms:9.3f} ms ± {m.spread_ms:.2g}{paid}{energy}{mark}"
            )
        if r.tie:
            lines.append(f"  {r.tie}")
        if r.confirmation:
            lines.append(f"  {r.confirmation}")
        if r.others_busy_cores is not None and r.others_busy_cores > MAX_OTHERS_BUSY:
            lines.append(
                f"  warning: other processes kept {r.others_busy_cores:.2f} cores busy while these were timed "
                f"({r.timing_attempts} attempts): the choice may be off; optimize again when the machine is quiet"
            )
    if r.call_path is not None:
        lines.append(r.call_path.summary())
    if r.simplify_failed:
        lines.append(f"note: {r.simplify_failed}")
    for change in r.rewritten:
        lines.append(f"note: {change}")
    if r.cuda_graph_off:
        lines.append(f"note: no CUDA graphs, each kernel launched on its own: {r.cuda_graph_off}")
    for text in (*r.engine_blockers.values(), *r.left_out.values()):
        lines.append(f"note: {text}")
    for rule, seeds in r.capped.items():
        lines.append(
            f"note: the pattern generator stopped growing {seeds} seed(s) of {rule} at its cap (candidates.MAX_GROUPS_PER_SEED, "
            "fewer on large graphs): larger fusions there were not tried"
        )
    for warning in r.warnings:
        lines.append(f"warning: {warning}")
    if r.graph_level is not None:
        lines += ["", graph_level_text(r.graph_level, r.finalists)]
    if r.substitution_search is not None:
        lines += ["", substitutions_text(r.substitution_search, kept=bool(r.substituted))]
    if r.candidates:
        lines.append(
            f"optimization: {r.candidates} candidates ({r.distinct} distinct), "
            f"{r.measured} measured now{_timed_once_text(r.timed_once)}, {_skipped_text(r.skipped)}{_timed_out_text(r.timed_out)}"
            "the rest from the cost log; "
            f"{r.seconds.total:.1f} s in all ({_stages_text(r.seconds)})"
            + ("" if r.exact else "; placement searched at each lowest unplaced node only, its most promising partial placements (state cap)")
        )
        if (measuring := measuring_text(r)) is not None:
            lines.append(measuring)
        if r.cache_flushed:
            lines.append(f"candidates timed cold: {r.cache_flushed}")
        if r.interplays:
            pairs = ", ".join(f"{pair} {ms:.3f} ms" for pair, ms in r.interplays.items())
            measured = f", measured now in {r.interplay_s:.1f} s" if r.interplay_s >= 0.05 else ", from the cost log"
            lines.append(f"libraries sharing the cores, priced a pair of calls: {pairs}{measured}")
        if r.assembled_s:
            steps = ", ".join(f"{name} {s:.1f} s" for name, s in r.assembled_s.items())
            lines.append(f"assembling and checking's {r.seconds.assemble:.1f} s: {steps}")
    if opt.fallbacks:
        lines += ["", "fell back to tvm:"]
        lines += [f"  {p.backend} {p.pattern} [{ops_text(p.ops)}]: {reason}" for p, reason in opt.fallbacks]
    if opt.excluded:
        lines += ["", "backends not used:"]
        lines += [f"  {name}: {reason}" for name, reason in sorted(opt.excluded.items())]
    if opt.simplified is not None:
        fired = [f"{s.name} x{s.applied}" for s in opt.simplified.steps if s.applied]
        lines += [
            "",
            f"simplified first: ops {opt.simplified.ops_before} -> {opt.simplified.ops_after}"
            + (f" ({', '.join(fired)})" if fired else ""),
        ]
    return "\n".join(lines)


def _choice_rule(r: RunRecord) -> str:
    """How the kept finalist was chosen, in words."""
    if any(f.paid_ms is not None for f in r.finalists.values()):
        return ("the one a user pays least for leads (lowest upper quartile of its blocks); "
                "of those equivalent to it round by round, the simplest is kept")  # fmt: skip
    if r.objective.is_time:
        return "the fastest is kept; of those within noise, the simplest"
    return f"the best for {r.objective} is kept; of those within noise, the simplest"


def _budget_sets(calibration_sets: int) -> str:
    if not calibration_sets:
        return "a second draw"
    return f"{calibration_sets} calibration set{'s' if calibration_sets > 1 else ''}"


def precision_text(partition) -> str:
    """A reduced-precision partition's precision and, where measured, its own error against
    float32 (the whole module's is on the accuracy line): "bf16, error 1.2e-03"."""
    error = partition.cost.error if partition.cost.is_valid else None
    return short(partition.candidate.precision) + ("" if error is None else f", error {error:.1e}")
