"""The demo corpus: the Python standard library's own sources, present on every machine.

Files are split by a hash of their name (stable across machines and Python versions)
into three disjoint sets: the target's pretraining text, the drafter's prompts, and
held-out evaluation prompts. A sample is a chat turn: the user shows a few lines of
code, the assistant continues them. The target learns that format, so the real chat
template and assistant loss-mask paths run end to end.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

SPLITS = ("target", "drafter", "eval")
INSTRUCTION = "Continue this Python code:\n"


def stdlib_files() -> list[Path]:
    """Top-level .py modules of the running interpreter's standard library, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if len(files) < 30:
        raise RuntimeError(
            f"found only {len(files)} standard-library sources under {root}; the demo corpus "
            "needs the interpreter's Lib/*.py files (a full CPython install)"
        )
    return files


def split_of(path: Path, shares: tuple[int, int, int]) -> str:
    """'target' | 'drafter' | 'eval' from a hash of the file name; shares sum to 100."""
    h = int(hashlib.sha256(path.name.encode()).hexdigest(), 16) % 100
    if h < shares[0]:
        return SPLITS[0]
    return SPLITS[1] if h < shares[0] + shares[1] else SPLITS[2]


def normalised_lines(source: str) -> list[str]:
    """Code without comments or docstrings, in `ast.unparse`'s canonical formatting.

    A model of a few hundred thousand parameters trained for two minutes cannot learn
    English prose; canonical code is regular enough that its greedy output is code.
    """
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    lines = ast.unparse(tree).splitlines()
    return [ln for ln in lines if ln.strip() and len(ln) <= 100]


def samples_of(path: Path, prompt_chars: int, response_chars: int) -> list[dict[str, str]]:
    """Consecutive, non-overlapping (prompt, response) chunks of whole lines."""
    try:
        lines = normalised_lines(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, OSError, SyntaxError, ValueError, RecursionError):
        return []  # a source this interpreter cannot parse is simply not used
    out, i = [], 0
    while i < len(lines):
        chunks = []
        for budget in (prompt_chars, response_chars):
            chunk, n = [], 0
            while i < len(lines) and n + len(lines[i]) + 1 <= budget:
                chunk.append(lines[i])
                n += len(lines[i]) + 1
                i += 1
            chunks.append("\n".join(chunk))
        if not chunks[0] or not chunks[1]:
            i += 1  # a single over-budget line: skip it
            continue
        out.append({"prompt": INSTRUCTION + chunks[0], "response": chunks[1]})
    return out


def build_samples(
    shares: tuple[int, int, int], prompt_chars: int, response_chars: int
) -> dict[str, list[dict[str, str]]]:
    """All samples per split, in a fixed order (sorted files, file order of chunks)."""
    by_split: dict[str, list[dict[str, str]]] = {s: [] for s in SPLITS}
    for path in stdlib_files():
        split = split_of(path, shares)
        for k, s in enumerate(samples_of(path, prompt_chars, response_chars)):
            by_split[split].append({"id": f"{path.stem}:{k}", **s})
    return by_split
