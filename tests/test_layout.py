"""The package layout: backends/ and patterns/ are parts of the library, never top-level packages."""

import pathlib
import re

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
