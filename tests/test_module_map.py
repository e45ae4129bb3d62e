"""README's module map and docs/architecture.md's folder tables name exactly the modules
in the tree: a module added, moved or removed fails here until the docs say so."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELL = re.compile(r"`([^`]+)`")


def _first_column(markdown: str, heading: str) -> set[str]:
    """Backticked names in the first column of the tables under `heading` (to the next
    heading of the same or a higher level)."""
    level = heading.split(" ")[0]
    lines = markdown.splitlines()
    start = lines.index(heading)
    names: set[str] = set()
    for line in lines[start + 1 :]:
        if re.match(rf"#{{1,{len(level)}}} ", line):
            break
        if line.startswith("| `"):
            names |= set(CELL.findall(line.split("|")[1]))
    return names


def test_readme_map_is_the_tree():
    named = _first_column((ROOT / "README.md").read_text(), "## How it works")
    tree = {f"dflash/{p.name}" for p in (ROOT / "dflash").glob("*.py") if p.name != "__init__.py"}
    tree |= {
        f"dflash/{p.name}/" for p in (ROOT / "dflash").iterdir() if (p / "__init__.py").exists()
    }
    tree |= {"bench/", "images/", "tests/"}
    assert named == tree, (
        f"only in README: {sorted(named - tree)}; only in the tree: {sorted(tree - named)}"
    )


def test_architecture_lists_every_module_of_every_folder():
    doc = (ROOT / "docs/architecture.md").read_text()
    for pkg in sorted(p for p in (ROOT / "dflash").iterdir() if (p / "__init__.py").exists()):
        if pkg.name == "recipes":  # one reader module and data files, described in prose
            continue
        named = _first_column(doc, f"### dflash/{pkg.name}")
        named = {n for cell in named for n in re.split(r",\s*", cell)}
        tree = {p.name for p in pkg.glob("*.py") if p.name != "__init__.py"}
        assert named == tree, (
            f"dflash/{pkg.name}: only in docs/architecture.md: {sorted(named - tree)}; "
            f"only in the tree: {sorted(tree - named)}"
        )
