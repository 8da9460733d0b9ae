"""The package layout: backends/ and patterns/ are parts of the library, never top-level packages;
no module of it imports one that imports it back, or another's private names; each part of
the library imports only the layers before it (``LAYERS``), lazy imports included."""

import ast
import pathlib
import re

import networkx as nx

import collage
import collage.backends
import collage.patterns

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_backends_and_patterns_are_subpackages_of_collage():
    assert pathlib.Path(collage.backends.__file__).parent == ROOT / "backends"
    assert pathlib.Path(collage.patterns.__file__).parent == ROOT / "patterns"


def test_nothing_imports_bare_backends_or_patterns():
    bare = re.compile(r"^\s*(from|import)\s+(backends|patterns)\b", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*.py")
        if ".venv" not in p.parts and bare.search(p.read_text())
    ]
    assert offenders == []


def _imports(path: pathlib.Path, name: str):
    """(module imported, names taken from it) for each ``from collage... import`` of a module,
    those under ``if TYPE_CHECKING:`` left out (they never run)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
               for n in ast.walk(node)}  # fmt: skip
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in skipped:
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            if module.startswith("collage"):
                yield module, [a.name for a in node.names]


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in (ROOT / "collage").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_no_import_cycles_and_no_private_names_imported():
    modules = _modules()
    edges, private = {}, []
    for name, path in modules.items():
        edges[name] = set()
        for module, names in _imports(path, name):
            for imported in names:
                target = f"{module}.{imported}" if f"{module}.{imported}" in modules else module
                if target in modules and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
                if imported.startswith("_") and not imported.startswith("__"):
                    private.append(f"{name} imports {module}.{imported}")
    graph = nx.DiGraph([(a, b) for a, targets in edges.items() for b in targets])
    assert list(nx.simple_cycles(graph)) == [] and private == []


def test_every_package_is_installed():
    """pyproject.toml lists the packages a wheel gets: a new stage package missing there would
    import from a checkout and be absent once installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "collage").rglob("__init__.py")}
    assert found - listed == set()


# The parts of the library, earliest first: each may import those before it. ``collage`` is
# the package's own ``__init__``; backends/ and patterns/ are ``collage.backends`` and
# ``collage.patterns``.
LAYERS = ("errors", "model", "candidates", "patterns", "measuring", "backends", "placing", "assembling", "config",
          "record", "prepare", "choosing", "deploying", "api", "server", "torch_compile", "collage", "cli",
          "__main__")  # fmt: skip

def _library_modules() -> dict[str, pathlib.Path]:
    """Every module of the library by its name, backends/ and patterns/ included."""
    found = {}
    for top in ("collage", "backends", "patterns"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts if top == "collage" else ("collage", *parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _every_import(path: pathlib.Path, name: str, modules: dict):
    """Each module of collage ``path`` imports, wherever the import stands (a lazy import
    inside a function is an arrow too): ``from M import N`` names M.N where that is a module
    (M's ``__init__`` loads with any of its modules, as a parent), else M."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            yield from (f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_each_part_imports_only_earlier_layers():
    modules = _library_modules()
    assert {_layer(m) for m in modules} <= set(LAYERS), "a new part of the library: place it in LAYERS"
    backwards = set()
    for name, path in modules.items():
        for imported in _every_import(path, name, modules):
            while imported not in modules and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported in modules and LAYERS.index(_layer(name)) < LAYERS.index(_layer(imported)):
                backwards.add((name, imported))
    assert backwards == set(), "imports a later layer"
