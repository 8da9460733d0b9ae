"""What tests share: zoo graphs loaded once, candidate samples, failures, outputs compared with torch's."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
from tvm import relax

from collage.measuring.arrays import static_shape
from collage.measuring.build import check_candidate
from collage.measuring.measure import TRANSITION
from collage.candidates.generate import distinct, generate
from collage.model.graph import DataflowGraph
from collage.model.simplify import simplify
from experiments import models
from experiments.check_candidates import remembered_reference


@functools.lru_cache(maxsize=None)
def zoo(name: str) -> models.Workload:
    """A zoo model at its test size, built and exported once per suite: the pipeline's, the
    simplification's and both conversions' tests each read every model, and exporting one to
    Relax takes up to 8 s (NASNet). The whole zoo held so is 1.6 GB. Tests only read it."""
    return models.load(name, small=True)


@functools.lru_cache(maxsize=None)
def zoo_graph(name: str, simplified: bool = False) -> DataflowGraph:
    """A zoo model at its test size, as a graph (after ``collage.simplify`` if asked)."""
    mod = zoo(name).relax
    return DataflowGraph.from_module(simplify(mod) if simplified else mod)


def with_weights_bound(mod, names=None, seed: int = 0):
    """``mod`` with the parameters ``names`` (default: all but the first) bound to seeded
    constants, as a model's weights are; kernels then read them once, at compile time."""
    rng = np.random.default_rng(seed)
    params = {p.name: p for p in mod["main"].params}
    names = list(params)[1:] if names is None else names
    weights = {n: rng.standard_normal(static_shape(params[n].ty)).astype("float32") for n in names}
    return relax.transform.BindParams("main", weights)(mod)


def kernel_rows(log, backend: str) -> list:
    """``backend``'s rows of the cost log ``log`` less its transition's, which is measured and
    logged beside its candidates."""
    return [r for r in log.rows(backend) if r.pattern != TRANSITION]


def zoo_candidates(name: str, backend, simplified: bool = False):
    return generate(zoo_graph(name, simplified), [backend])


def sample(candidates, limit: int | None = None):
    """One candidate per structural key: first enough to cover every pattern and operator
    seen, then evenly spaced others, at most ``limit`` in all."""
    unique = distinct(candidates)
    if limit is None:
        return unique
    chosen, covered = [], set()
    for c in sorted(unique, key=lambda c: -len(c.subgraph)):
        seen = {c.pattern, *c.subgraph.ops}
        if not covered.issuperset(seen):
            chosen.append(c)
            covered |= seen
    rest = [c for c in unique if c not in chosen]
    step = max(1, len(rest) // max(1, limit - len(chosen)))
    return (chosen + rest[::step])[:limit]


def failures(backend, candidates, target: str = "llvm") -> dict[str, str]:
    """Each candidate that does not compile, run and agree with TVM, with the reason."""
    return {
        f"{c} {'+'.join(c.subgraph.ops)}": reason
        for c in candidates
        if (reason := check_candidate(backend, c.subgraph.extract(), c.pattern, target, reference=remembered_reference))
        is not None
    }


# Of the reference's largest magnitude: float32 accumulation-order differences across 50+
# layers sit around 1e-5..3e-4 of it.
REL_TOL = 1e-3


def assert_close(out, ref, what):
    """``out`` has ``ref``'s shape and is within ``REL_TOL`` of its largest magnitude."""
    scale = float(np.abs(ref).max())
    err = float(np.abs(out - ref).max())
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert err <= REL_TOL * scale, f"{what}: max |diff| {err:.3g} exceeds {REL_TOL} x {scale:.3g}"


ROOT = Path(__file__).resolve().parents[1]


def timed_end_to_end(opt, name: str) -> bool:
    """Whether finalist ``name`` of ``opt`` was built, checked and timed: under its own name, or,
    an engine alone that is the op-level placement, once as it, and said so."""
    timed = {str(n): f for n, f in opt.record.finalists.items()}
    same = f"{name} is the 'op-level' placement (one partition, the whole model), timed once as it"
    return (name in timed and timed[name].measured.median_ms > 0) or opt.record.left_out.get(name) == same


def subprocess_env(**extra) -> dict:
    """The environment of a command-line test's subprocess: this checkout on its path, and the
    suite's quick settings applied at its start (``tests/subprocesses/sitecustomize.py``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "subprocesses")]), **extra}
