"""The ``collage`` command: optimize an ONNX model, rebuild it from a saved placement, list
the backends, look into the cost log.

    collage optimize MODEL.onnx [--target llvm] [--graph-level [--budget 600]] [--threads N]
                                [--substitutions [--alpha 1.05] [--objective time]]
                                [--out placement.json] [--export DIR]
                                [--draw placement.svg]
    collage run MODEL.onnx [--placement placement.json]
    collage run DIR                      (a module written by --export: nothing measured or compiled)
    collage backends
    collage log stats | show | clear
    collage serve --tracker HOST:PORT --key KEY [--threads N]   (a measuring server of a fleet)

``collage optimize --tracker HOST:PORT --key KEY`` measures on the servers registered under
KEY with that TVM RPC tracker instead of here (docs/fleet.md).

Libraries' own output (TVM's C++ log, Python warnings) is kept off the terminal unless
``--verbose`` is given.

A user's mistake (no such file, not an ONNX model, an operator TVM cannot import, an unknown
backend, a placement made for another model) is one line ``collage: error: ...`` on stderr
and exit status 2 for a wrong argument, 1 for the rest; argparse's own usage errors exit
with 2 as usual. A bug in collage itself still shows its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import warnings
from pathlib import Path

from .candidates.backend import TARGETS

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
DEFAULT_PLACEMENT = "placement.json"
SHOW_LIMIT = 20
# What each table of the cost log holds, in words (``collage log stats|clear``).
TABLE_WORDS = {
    "costs": "measured costs",
    "reference_outputs": "saved reference outputs",
    "placement_latency": "end-to-end placement latencies",
}


class UsageError(Exception):
    """An argument is wrong on its face (an unknown backend, a malformed shape)."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = parser().parse_args(argv)
    from .errors import OptimizeError
    from .measuring.cost_log import CostLogError
    from .deploying.exported import ExportError
    from .model.frontend import ModelImportError

    try:
        with _libraries_hushed(args.verbose):
            return args.run(args)
    except UsageError as err:
        return _fail(err, EXIT_USAGE)
    except (ModelImportError, OptimizeError, CostLogError, ExportError) as err:
        return _fail(err, EXIT_ERROR)
    except OSError as err:  # a file that cannot be read or written
        return _fail(f"{err.filename}: {err.strerror}" if err.filename else err, EXIT_ERROR)
    except KeyboardInterrupt:
        print("collage: interrupted", file=sys.stderr)
        return 130


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collage", description="Place each part of a model on the backend where it runs fastest."
    )
    p.add_argument(
        "--verbose", action="store_true",
        help="let the libraries' own messages through (TVM's C++ log, warnings); by default only collage's lines show",
    )  # fmt: skip
    commands = p.add_subparsers(title="commands", required=True, metavar="COMMAND")

    opt = commands.add_parser("optimize", help="measure, place and assemble an ONNX model; save the placement")
    _model_arguments(opt)
    opt.add_argument(
        "--graph-level", action="store_true", help="refine what goes to whole-graph engines (evolutionary search)"
    )
    opt.add_argument(
        "--budget", type=float, metavar="S", help="seconds for the graph-level search (default: optimize's)"
    )
    opt.add_argument(
        "--substitutions", action="store_true",
        help="search graph rewrites (merged parallel operators, folded linear ones) jointly with the placement",
    )  # fmt: skip
    opt.add_argument(
        "--alpha", type=float, metavar="A",
        help="keep rewritten graphs up to A times the best cost (default: optimize's 1.05; 1 is greedy)",
    )  # fmt: skip
    opt.add_argument(
        "--objective", metavar="OBJ",
        help="what the substitution search minimizes: time (default), energy, power or e.g. 0.5*time+0.5*energy",
    )  # fmt: skip
    opt.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_PLACEMENT),
        help=f"placement file to write (default {DEFAULT_PLACEMENT})",
    )
    opt.add_argument(
        "--export", type=Path, metavar="DIR",
        help="also write the optimized module to DIR, for `collage run DIR` and collage.load (no measuring or compiling)",
    )  # fmt: skip
    opt.add_argument(
        "--draw", type=Path, metavar="PICTURE", help="draw the placement: .svg, .png, .pdf (needs Graphviz) or .dot"
    )
    opt.add_argument("--seed", type=int, default=0, help="seed of the random inputs used for checking (default 0)")
    opt.add_argument(
        "--accuracy", type=float, metavar="E",
        help="largest error accepted, relative to each output's largest magnitude (1e-2: 1%%); lets backends "
        "compute in bfloat16 where the CPU has it natively, within it (default: float32 everywhere)",
    )  # fmt: skip
    opt.add_argument(
        "--calibration", type=Path, action="append", metavar="INPUTS.npz",
        help="with --accuracy: an input set the budget is held on instead of a second random draw, its arrays "
        "named by the model's inputs (numpy.savez); repeat for more sets",
    )  # fmt: skip
    opt.add_argument("--no-simplify", dest="simplify", action="store_false", help="skip collage.simplify")
    opt.add_argument("--quiet", action="store_true", help="no progress bar")
    opt.add_argument(
        "--in-process", action="store_true",
        help="measure candidates in this process: no worker to start, but a library that crashes ends the run",
    )  # fmt: skip
    opt.add_argument("--tracker", metavar="HOST:PORT", help="measure on the servers of a TVM RPC tracker (with --key)")
    opt.add_argument("--key", help="the device key the measuring servers registered under (`collage serve --key`)")
    opt.set_defaults(run=optimize_command)

    serve = commands.add_parser(
        "serve", help="measure candidates for optimizations on other machines: a server registered with a TVM RPC tracker"
    )
    serve.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the TVM RPC tracker to register with")
    serve.add_argument("--key", required=True, help="the device key clients ask the tracker for (one per device kind)")
    serve.add_argument("--threads", type=_positive, metavar="N", help="threads to measure on (default: all cores)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_positive, default=9091, help="the first port to try (default 9091)")
    serve.add_argument("--target", choices=TARGETS, default="llvm", help="what it measures for (default llvm)")
    serve.set_defaults(run=serve_command)

    run = commands.add_parser(
        "run",
        help="rebuild the optimized model from a saved placement, or load an exported one, and time it (measures nothing)",
    )
    _model_arguments(run, defaults_from="the placement", metavar="MODEL.onnx|DIR")
    run.add_argument("--placement", type=Path, default=Path(DEFAULT_PLACEMENT), help=f"(default {DEFAULT_PLACEMENT})")
    run.set_defaults(run=run_command)

    backends = commands.add_parser("backends", help="the registered backends and whether they can run here")
    backends.set_defaults(run=backends_command)

    log = commands.add_parser("log", help="what the cost log holds")
    actions = log.add_subparsers(title="actions", required=True, metavar="ACTION")
    stats = actions.add_parser("stats", help="costs per backend and device")
    show = actions.add_parser("show", help="the newest costs")
    show.add_argument("--backend", help="only this backend's costs")
    show.add_argument(
        "--limit", type=int, default=SHOW_LIMIT, help=f"at most this many rows (default {SHOW_LIMIT}; 0: all)"
    )
    clear = actions.add_parser("clear", help="delete everything in the cost log")
    clear.add_argument("--yes", action="store_true", help="really delete (without it, say what would go)")
    for action, command in ((stats, log_stats_command), (show, log_show_command), (clear, log_clear_command)):
        _log_argument(action)
        action.set_defaults(run=command)
    return p


def _model_arguments(p: argparse.ArgumentParser, defaults_from: str | None = None, metavar: str = "MODEL.onnx") -> None:
    default = f" (default: {defaults_from}'s)" if defaults_from else ""
    p.add_argument("model", type=Path, metavar=metavar)
    p.add_argument("--target", choices=TARGETS, default=None if defaults_from else "llvm",
                   help=f"where it runs{default or ' (default llvm)'}")  # fmt: skip
    p.add_argument(
        "--backends", metavar="A,B,...", help=f"only these backends{default or ' (default: all registered)'}"
    )
    p.add_argument(
        "--threads", type=_positive, metavar="N", help=f"threads for every backend{default or ' (default: all cores)'}"
    )
    p.add_argument(
        "--shape", action="append", default=[], metavar="INPUT=1x3x224x224", help="fix a dynamic input's shape"
    )
    _log_argument(p)
    # Also after the command, where users put it; SUPPRESS leaves the top-level value alone.
    p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help="as before the command")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _log_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log", type=Path, metavar="PATH", help="cost log (default $COLLAGE_COST_LOG or ~/.cache/collage/costs.sqlite)"
    )


# -- optimize and run --


def optimize_command(args) -> int:
    from .api import optimize_with
    from .config import Config
    from .measuring.runner import InProcess
    from .deploying.saved import save_placement

    backends, shapes, extra = _backends(args.backends), _shapes(args.shape), _graph_level(args) | _substitutions(args)
    if (args.tracker is None) != (args.key is None):
        raise UsageError("--tracker and --key go together: the tracker, and the key its measuring servers registered under")
    if args.tracker is not None and args.in_process:
        raise UsageError("--in-process measures here; --tracker on the servers of a tracker: give one of them")
    if args.tracker is not None:
        from .measuring.rpc_runner import RPCRunner

        runner = RPCRunner(args.tracker, args.key, target=args.target)
    else:
        runner = InProcess() if args.in_process else None
    config = Config(
        target=args.target, threads=args.threads or 0, seed=args.seed, simplify=args.simplify,
        progress=not args.quiet, runner=runner, accuracy=args.accuracy, **extra,
    )  # fmt: skip
    _check_picture(args.draw)  # before the minutes of optimizing, not after
    # The file itself: each inference engine also runs it whole, as its users would, and where
    # TVM cannot import it, they alone do.
    calibration = [_input_set(path) for path in args.calibration or ()]
    opt = optimize_with(config, args.model, backends, args.log, shapes=shapes, calibration=calibration or None)
    print(opt.report())
    made_for = f" (for {opt.optimized_for})" if opt.record.optimized_for is not None else ""
    if opt.record.not_imported is None:
        print(f"\nplacement written to {save_placement(opt, args.out)}{made_for}")
    else:
        print("\nno placement written: a placement file places what TVM imports (--export writes the module)")
    if args.export is not None:
        print(f"module exported to {opt.export(args.export)}")
    if args.draw is not None:
        _draw(opt, args.draw)
    return EXIT_OK


def serve_command(args) -> int:
    from .measuring.rpc_runner import parse_address
    from .server import serve
    from .measuring.threads import default_threads

    serve(parse_address(args.tracker), args.key, args.threads or default_threads(), args.host, args.port,
          target=args.target)  # fmt: skip
    return EXIT_OK


def run_command(args) -> int:
    from .measuring.cost_log import CostLog
    from .model.frontend import load_onnx
    from .api import load_placement
    from .deploying.saved import read_placement

    if args.model.is_dir():
        return _run_exported(args)
    backends, shapes = _backends(args.backends), _shapes(args.shape)
    saved = read_placement(args.placement)
    mod = load_onnx(args.model, shapes)
    log = CostLog(args.log)
    logged = len(log)
    opt = load_placement(mod, args.placement, args.target, backends, log, onnx_model=args.model, threads=args.threads)
    unknown = sum(1 for p in opt.placement if p.cost.is_unknown)
    print(opt.report())
    print(
        f"\nplacement read from {args.placement}: measured 0 candidates (cost log: {logged} rows before, {len(log)} after); "
        f"{len(opt.placement) - unknown} of {len(opt.placement)} partition costs from the log"
    )
    if saved.measured_ms is not None:
        made = f" for {saved.device}" if saved.device else ""
        print(f"when it was made{made} it ran in {saved.measured_ms:.3f} ms there; now {opt.measured.median_ms:.3f} ms")
    return EXIT_OK


def _run_exported(args) -> int:
    """``collage run DIR``: load the exported module, call it once, time it."""
    from .deploying.exported import load
    from .choosing.finalists import time_finalists

    given = [f"--{o}" for o in ("target", "backends", "log") if getattr(args, o) is not None]
    given += ["--shape"] * bool(args.shape) + ["--placement"] * (args.placement != Path(DEFAULT_PLACEMENT))
    if given:
        raise UsageError(f"{args.model} is an exported module: {', '.join(given)} do not apply to it (--threads does)")
    loaded = load(args.model, threads=args.threads)
    arrays = loaded.example_inputs()
    first = loaded.first_call_s(arrays)
    now = time_finalists({"exported": loaded.vm}, arrays, loaded.target).costs["exported"]
    print(loaded.describe())
    print(f"first call {first * 1e3:.3f} ms; now it runs in {now.median_ms:.3f} ms ± {now.spread_ms:.2g} (median of {now.samples})")
    return EXIT_OK


def _backends(names: str | None) -> list[str] | None:
    """The names in ``--backends``, each a registered backend."""
    if names is None:
        return None
    from .candidates.backend import default_backends

    chosen = [n.strip() for n in names.split(",") if n.strip()]
    known = default_backends().names()
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        what = f"unknown backend(s) {', '.join(unknown)}" if unknown else "--backends names none"
        raise UsageError(f"{what}; registered: {', '.join(known)} (see `collage backends`)")
    return chosen


def _shapes(specs: list[str]) -> dict[str, list[int]]:
    """``--shape x=1x3x224x224`` arguments as the ONNX importer's shape dictionary."""
    shapes = {}
    for spec in specs:
        name, _, dims = spec.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split("x")]
        except ValueError:
            raise UsageError(f"--shape {spec!r}: write INPUT=1x3x224x224") from None
        if not name or any(d < 1 for d in shapes[name]):
            raise UsageError(f"--shape {spec!r}: write INPUT=1x3x224x224 with positive sizes")
    return shapes


def _input_set(path: Path) -> dict:
    """One input set from a NumPy ``.npz`` file: input name -> array."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}
    except ValueError as err:  # a missing file is an OSError, reported as such
        raise UsageError(f"--calibration {path}: not a NumPy .npz file of input arrays ({err})") from None


def _graph_level(args) -> dict:
    """The settings (``Config``) of ``--graph-level`` and ``--budget``."""
    if not args.graph_level:
        if args.budget is not None:
            raise UsageError("--budget is the graph-level search's: give --graph-level too")
        return {}
    return {"graph_level": True} | ({"budget_s": args.budget} if args.budget is not None else {})


def _substitutions(args) -> dict:
    """The settings (``Config``) of ``--substitutions``, ``--alpha`` and ``--objective``."""
    if not args.substitutions:
        for option in ("alpha", "objective"):
            if getattr(args, option) is not None:
                raise UsageError(f"--{option} is the substitution search's: give --substitutions too")
        return {}
    if args.alpha is not None and args.alpha < 1:
        raise UsageError(f"--alpha must be at least 1 (1 keeps only improving rewrites), got {args.alpha}")
    given = {"alpha": args.alpha, "objective": args.objective}
    return {"substitutions": True} | {k: v for k, v in given.items() if v is not None}


def _check_picture(path: Path | None) -> None:
    from .deploying.draw import FORMATS

    if path is not None and path.suffix.lower().lstrip(".") not in FORMATS:
        raise UsageError(f"--draw {path}: the name must end in .{', .'.join(FORMATS)}")


def _draw(opt, path: Path) -> None:
    """Draw the placement; a missing Graphviz is a warning, since the placement is saved."""
    from .deploying.draw import DrawError, draw

    if not opt.placement:  # nothing was placed: the report said why
        print("collage: warning: no picture: nothing was placed", file=sys.stderr)
        return
    try:
        print(f"picture written to {draw(opt, path)}")
    except DrawError as err:
        print(f"collage: warning: {err}", file=sys.stderr)


# -- backends --


def backends_command(args) -> int:
    from .candidates.backend import default_backends

    backends = default_backends()
    why_not = {target: backends.usable(target)[1] for target in TARGETS}
    rows = [("backend", "kind", "targets", "library", "usable here")]
    for b in backends:
        status = [f"{t}: {_usable_text(why_not[t].get(b.name))}" for t in b.targets]
        rows.append((b.name, b.kind, ", ".join(b.targets), b.library, "; ".join(status)))
    print(_table(rows))
    return EXIT_OK


def _usable_text(reason: str | None) -> str:
    return "yes" if reason is None else f"no, {reason}"


# -- log --


def log_stats_command(args) -> int:
    log = _existing_log(args)
    if log is None:
        return EXIT_OK
    rows = [("backend", "device", "rows", "valid", "failed")]
    for (backend, device), s in log.stats().items():
        rows.append((backend, device, str(s.rows), str(s.rows - s.failures), str(s.failures)))
    print(f"cost log {log.path}")
    print(_table(rows) if len(rows) > 1 else "(no costs)")
    print("; ".join(f"{n} {TABLE_WORDS.get(t, t)}" for t, n in log.sizes().items()))
    return EXIT_OK


def log_show_command(args) -> int:
    from .candidates.precision import short

    log = _existing_log(args)
    if log is None:
        return EXIT_OK
    found = log.rows(args.backend, args.limit or None)
    rows = [("measured at", "backend", "pattern", "threads", "key", "cost")]
    for r in found:
        cost = (
            f"{r.median_ms:.4g} ms ± {r.spread_ms:.2g}, {r.samples} samples"
            if r.failure is None
            else f"failed: {r.failure}"
        )
        if r.error is not None:  # a reduced precision's: each run holds it to its own budget
            cost += f" ({short(r.precision)}, error {r.error:.2g})"
        rows.append((r.measured_at, r.backend, r.pattern, str(r.threads), r.key[:12], cost))
    total = sum(s.rows for (b, _), s in log.stats().items() if args.backend in (None, b))
    print(f"cost log {log.path}: {len(found)} of {total} rows, newest first")
    if found:
        print(_table(rows))
    return EXIT_OK


def log_clear_command(args) -> int:
    log = _existing_log(args)
    if log is None:
        return EXIT_OK
    held = "; ".join(f"{n} {TABLE_WORDS.get(t, t)}" for t, n in log.sizes().items())
    if not args.yes:
        print(f"would delete from {log.path}: {held}; pass --yes to delete")
        return EXIT_ERROR
    log.clear()
    print(f"deleted from {log.path}: {held}")
    return EXIT_OK


def _existing_log(args):
    """The cost log to look into, or None (and a line saying so) when there is none: looking
    must not create one."""
    from .measuring.cost_log import CostLog, default_path

    path = args.log or default_path()
    if not path.exists():
        print(f"no cost log at {path} (nothing measured there yet)")
        return None
    return CostLog(path)


# -- output --


@contextlib.contextmanager
def _libraries_hushed(verbose: bool):
    """Keep what libraries write straight to file descriptor 2 (TVM's C++ log lines, up to a
    hundred on one model, some after the error) and Python warnings off the terminal, unless
    ``verbose``. Collage's own lines (progress, report, the error, last) still reach it:
    ``sys.stderr`` is moved to a copy of the terminal's descriptor."""
    if verbose:
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    own = _is_fd2(sys.stderr)  # else a harness (pytest) holds sys.stderr: leave it there
    before = sys.stderr
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        os.dup2(sink.fileno(), 2)
        if own:
            sys.stderr = open(os.dup(terminal), "w", buffering=1, encoding=before.encoding, errors="backslashreplace")
        try:
            yield
        finally:
            if own:
                sys.stderr.close()
                sys.stderr = before
            os.dup2(terminal, 2)
            os.close(terminal)


def _is_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


def _table(rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in rows)


def _fail(err: Exception | str, status: int) -> int:
    """Say what went wrong on one line of stderr."""
    print(f"collage: error: {' '.join(str(err).split())}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
