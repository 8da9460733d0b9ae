"""Placement pictures: the model's graph with each partition filled in its backend's colour.

``to_dot(opt)`` gives Graphviz DOT text: one box per operator, labelled with its short op
name (the tooltip has the full name and output type), edges as data flows, each partition a
cluster filled with its backend's colour and labelled with its backend, pattern and cost,
and a legend with each backend's share of the estimated time. Edges between partitions are
drawn darker: each one is a hand-over between kernels. ``draw(opt, path)`` writes the DOT
file and, for ``.svg``, ``.png`` or ``.pdf``, has Graphviz's ``dot`` render it.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import zlib
from pathlib import Path

from tvm import relax

from ..candidates.precision import FLOAT32, short
from ..measuring.arrays import static_shape
from ..model.graph import DataflowGraph
from .report import backend_totals, short_op

# The built-in backends' colours: light enough for black labels, apart enough to tell.
BACKEND_COLOURS = {
    "tvm": "#c6dbef",
    "dnnl": "#fdd0a2",
    "mkl": "#fdae6b",
    "onnxruntime": "#c7e9c0",
    "openvino": "#dadaeb",
    "cudnn": "#fcbba1",
    "cublas": "#fc9272",
    "tensorrt": "#a1d99b",
    "inductor": "#fee391",
}
# For backends registered by users: picked by a hash of the name, so a backend keeps its
# colour from one picture to the next.
OTHER_COLOURS = ("#ffffb3", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f", "#8dd3c7", "#bebada")
RENDERED = ("svg", "png", "pdf")
DOT_SUFFIXES = ("dot", "gv")
FORMATS = RENDERED + DOT_SUFFIXES
RENDER_TIMEOUT_S = 120
MAX_BOXED_OPS = 2000


class DrawError(Exception):
    """The picture could not be rendered; the message says why and what was written."""


class GraphvizMissing(DrawError):
    """Graphviz's ``dot`` is not installed, so only the DOT file was written."""


def backend_colour(backend: str) -> str:
    """The fill colour of ``backend`` in pictures and plots."""
    if backend in BACKEND_COLOURS:
        return BACKEND_COLOURS[backend]
    return OTHER_COLOURS[zlib.crc32(backend.encode()) % len(OTHER_COLOURS)]


def to_dot(opt, boxed: bool | None = None) -> str:
    """The placement of ``opt`` (an ``OptimizedModule``) as Graphviz DOT text.

    ``boxed`` draws each partition as a filled cluster; the default does so up to
    ``MAX_BOXED_OPS`` operators (the zoo's largest, NASNet-A, has 839 and renders in 0.3 s).
    Past that Graphviz's cluster layout slows down (4,000 ops in 17 s boxed, 6 s not) and
    can fail ("trouble in init_rank"), so larger graphs get each operator filled in its
    backend's colour instead, with its partition in the tooltip.
    """
    partitions = opt.placement
    if not partitions:
        raise ValueError("an empty placement has nothing to draw")
    graph = partitions[0].candidate.subgraph.graph
    boxed = len(graph) <= MAX_BOXED_OPS if boxed is None else boxed
    lines = [
        "digraph placement {",
        f"  graph [label={_quote(_title(opt))}, labelloc=t, fontname=Helvetica, fontsize=12, nodesep=0.15, ranksep=0.25];",
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname=Helvetica, fontsize=9, height=0.25, '
        + 'margin="0.06,0.02"];',
        '  edge [arrowsize=0.5, color="#00000055"];',
    ]
    lines += _inputs_and_outputs(graph)
    for k, p in enumerate(partitions):
        lines += _partition(k, p, graph, boxed)
    lines += _edges(graph, partitions)
    lines += _legend(partitions)
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw(opt, path: str | os.PathLike) -> Path:
    """Write the placement picture to ``path``: DOT text for ``.dot``/``.gv``; for ``.svg``,
    ``.png`` or ``.pdf`` the DOT file beside it (same name, ``.dot``) rendered by Graphviz.
    Returns ``path``. Raises ``GraphvizMissing`` (the DOT file is written) when ``dot`` is
    not installed, ``DrawError`` when it fails."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"cannot draw to {path.name}: the name must end in one of .{', .'.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    dot_path = path if fmt in DOT_SUFFIXES else path.with_suffix(".dot")
    dot_path.write_text(to_dot(opt))
    if fmt in DOT_SUFFIXES:
        return path
    render(dot_path, path)
    return path


def render(dot_path: Path, path: Path) -> None:
    """Run Graphviz's ``dot`` on ``dot_path``, writing ``path`` in the format its suffix names."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing(
            f"wrote {dot_path} but not {path.name}: Graphviz's `dot` is not installed "
            "(Debian/Ubuntu: apt-get install graphviz)"
        )
    fmt = path.suffix.lstrip(".").lower()
    try:
        done = subprocess.run(
            [exe, f"-T{fmt}", "-o", str(path), str(dot_path)],
            check=False, capture_output=True, text=True, timeout=RENDER_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DrawError(
            f"wrote {dot_path}, but Graphviz took over {RENDER_TIMEOUT_S} s to render {path.name}"
        ) from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        raise DrawError(f"wrote {dot_path}, but Graphviz could not render {path.name}: {why}")


# -- parts of the picture --


def _title(opt) -> str:
    measured = opt.measured.median_ms
    return (
        f"collage placement: {len(opt.placement)} partitions, target {opt.target}, {opt.threads} thread(s); "
        f"estimated {_ms(opt.estimated_ms)}, measured {_ms(measured)}"
    )


def _inputs_and_outputs(graph: DataflowGraph) -> list[str]:
    style = 'shape=ellipse, style=filled, fillcolor="#f0f0f0"'
    lines = [f"  p{k} [label={_quote(_value_label(v.name, v.ty))}, {style}];" for k, v in enumerate(graph.func.params)]
    lines += [
        f"  out{i} [label={_quote(_value_label('output', graph[i].ty))}, {style}];" for i in sorted(graph.outputs)
    ]
    return lines


def _partition(k: int, partition, graph: DataflowGraph, boxed: bool) -> list[str]:
    """The partition's operators, in a cluster filled with its backend's colour, or (not
    ``boxed``) each filled with it."""
    colour = backend_colour(partition.backend)
    # Pattern names start with their backend's ("openvino.region"): one line says both.
    name = (
        partition.pattern
        if partition.pattern.startswith(f"{partition.backend}.")
        else f"{partition.backend} {partition.pattern}"
    )
    if partition.candidate.precision != FLOAT32:
        name += f" [{short(partition.candidate.precision)}]"
    label = f"{name}\n{_ms(partition.cost_ms)}"
    fill = "" if boxed else f', fillcolor="{colour}"'
    nodes = []
    for i in sorted(partition.nodes):
        node = graph[i]
        tooltip = f"node {i}: {node.op} -> {_type_text(node.ty)}" + ("" if boxed else f"; partition {k}: {label}")
        nodes.append(f"n{i} [label={_quote(short_op(node.op))}, tooltip={_quote(tooltip)}{fill}];")
    if not boxed:
        return [f"  {n}" for n in nodes]
    return [
        f"  subgraph cluster_{k} {{",
        f'    label={_quote(label)}; labeljust=l; fontsize=8; style="filled,rounded"; fillcolor="{colour}"; '
        + f'color="#00000066"; tooltip={_quote(f"partition {k}: {label}")};',
        *(f"    {n}" for n in nodes),
        "  }",
    ]


def _edges(graph: DataflowGraph, partitions) -> list[str]:
    part_of = {i: k for k, p in enumerate(partitions) for i in p.nodes}
    params = {v: k for k, v in enumerate(graph.func.params)}
    lines = []
    for node in graph:
        for v in relax.analysis.free_vars(node.value):
            if v in params:
                lines.append(f"  p{params[v]} -> n{node.index};")
        for i in node.inputs:
            crossing = part_of[i] != part_of[node.index]
            lines.append(f"  n{i} -> n{node.index}" + (" [color=black, penwidth=1.2];" if crossing else ";"))
    lines += [f"  n{i} -> out{i};" for i in sorted(graph.outputs)]
    return lines


def _legend(partitions) -> list[str]:
    """One swatch per backend: its partitions, ops and share of the estimated time."""
    totals = backend_totals(partitions)
    all_ms = sum(t.ms for t in totals.values()) or 1.0
    lines = ["  subgraph cluster_legend {", '    label="backends"; fontsize=9; style=rounded; color="#999999";']
    for k, (backend, (n, ops, ms)) in enumerate(totals.items()):
        text = f"{backend}: {n} partition(s), {ops} ops, {ms / all_ms:.0%} of the estimated time"
        lines.append(f'    legend{k} [label={_quote(text)}, fillcolor="{backend_colour(backend)}"];')
    lines.append("  }")
    return lines


# -- text --


def _ms(ms: float) -> str:
    return "not measured" if math.isnan(ms) else f"{ms:.3g} ms"


def _value_label(name: str, ty) -> str:
    return f"{name}\n{_type_text(ty)}"


def _type_text(ty) -> str:
    """``float32[1x64x56x56]`` for a static tensor, else TVM's own text of the type."""
    if isinstance(ty, relax.TensorType):
        try:
            return f"{ty.dtype}[{'x'.join(map(str, static_shape(ty)))}]"
        except ValueError:
            pass  # a symbolic shape: TVM's text says it best
    return str(ty)


def _quote(text: str) -> str:
    """A DOT string: backslashes and quotes escaped, line breaks as DOT's centred ``\\n``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
