"""A clone explains itself: no tracked file points at documents outside the repository
(the team's working notes lived beside it once; docs/algorithm.md replaced them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What a reference to the outside looked like: the notes' names and their folder, and
# phrases that only make sense to someone who was there.
OUTSIDE = re.compile(
    r"\.\./shared\b|\bshared/[A-Z]|DFLASH\.md|BUILD_NOTES|steering repo|seed deployment"
    r"|where this was written",
    re.IGNORECASE,
)


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    files = []
    for name in filter(None, out.split("\0")):
        path = ROOT / name
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary (images, wheels)
            continue
        files.append(path)
    return files


def test_no_reference_outside_the_repository():
    files = _tracked_text_files()
    assert len(files) > 100  # it read the tree, not an empty listing
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in files
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_is_for():
    for line in ("see ../shared/DFLASH.md", "(shared/BUILD_NOTES.md)", "the 8-GPU seed deployment"):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search("--out /mnt/nfs/RUN on a filesystem both nodes mount")
