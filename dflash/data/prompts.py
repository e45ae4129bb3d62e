"""Prompt files for eval and regeneration: JSONL rows in `messages` or `prompt` form."""

from __future__ import annotations

import json

from dflash.data.sources import DataError, normalise_record

Messages = list[dict[str, str]]


def load_prompt_rows(path: str) -> list[tuple[str, Messages]]:
    """(id, prompt messages) per JSONL row; trailing assistant turns are dropped."""
    rows: list[tuple[str, Messages]] = []
    seen: set[str] = set()
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if isinstance(row, dict) and isinstance(row.get("prompt"), str):
                    row = {**row, "response": row.get("response", "")}
                messages = normalise_record(row)
            except ValueError as e:
                raise DataError(f"{path}, line {lineno}: {e}") from None
            while messages and messages[-1]["role"] == "assistant":
                messages = messages[:-1]
            if not messages:
                raise DataError(f"{path}, line {lineno}: no prompt turns before the assistant")
            rid = str(row.get("id", lineno - 1))
            if rid in seen:
                raise DataError(f"{path}, line {lineno}: duplicate id {rid!r}; ids must be unique")
            seen.add(rid)
            rows.append((rid, messages))
    if not rows:
        raise DataError(f"{path}: no prompts")
    return rows
