"""Relaxed graph substitutions (MetaFlow, Jia et al. 2019), searched jointly with placement.

A substitution rule (``rule``) finds its sites in a graph; a site (``site``) rewrites one
place. The families: parallel operators merged (``parallel``), linear operators folded
(``linear``), concatenations and splits (``concat_split``). ``search`` is MetaFlow's
backtracking search over them, relaxed by ``alpha``: it keeps graphs up to ``alpha`` times
the best cost so far, because a step that is slower alone (a kernel enlarged) can open a
faster one (two convolutions merged). ``search_in_pieces`` (``split``) cuts a large graph
where few sites cross, searches the pieces and then the cuts. ``placement_cost`` is the cost
collage searches with: the op-level placement estimate, so that graph and placement are
chosen together.
"""

from . import split
from .concat_split import CONCAT_OF_SPLIT, ELEMENTWISE_BEFORE_SPLIT, SPLIT_OF_CONCAT
from .linear import FOLD_CONV_INTO_CONV1X1, FOLD_MATMUL_INTO_MATMUL
from .parallel import ENLARGE_CONV_KERNEL, MERGE_PARALLEL_CONV2D, MERGE_PARALLEL_MATMUL
from .rule import ParallelMerge, Rewrite, Substitution
from .search import GraphCost, SearchResult, Step, graph_key, replay, search
from .site import Site, apply
from .split import cut_points, search_in_pieces

DEFAULT_RULES: tuple[Substitution, ...] = (
    MERGE_PARALLEL_CONV2D,
    ENLARGE_CONV_KERNEL,
    MERGE_PARALLEL_MATMUL,
    FOLD_CONV_INTO_CONV1X1,
    FOLD_MATMUL_INTO_MATMUL,
    ELEMENTWISE_BEFORE_SPLIT,
    SPLIT_OF_CONCAT,
    CONCAT_OF_SPLIT,
)

__all__ = [
    "DEFAULT_RULES",
    "ParallelMerge",
    "Rewrite",
    "GraphCost",
    "SearchResult",
    "Step",
    "Site",
    "Substitution",
    "apply",
    "cut_points",
    "graph_key",
    "replay",
    "search",
    "search_in_pieces",
]
