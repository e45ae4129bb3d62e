"""Load training records from a local .jsonl, .parquet, or `datasets.save_to_disk` folder.

A record is either OpenAI-style `{"messages": [{"role", "content"}, ...]}` or
`{"prompt": str, "response": str}`; both normalise to a list of
`{"role": str, "content": str}` dicts. Loading validates every row once and keeps
only an index of the good ones (byte offsets for jsonl, row numbers for Arrow), so
a dataset of ~1M long conversations is not held in memory as Python objects; rows
are re-read and re-normalised on `__getitem__`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

ACCEPTED_FIELDS = (
    "'messages' (a list of {'role': str, 'content': str}) or 'prompt' + 'response' (strings)"
)
_ARROW_BATCH = 1024


class DataError(ValueError):
    """Bad training data: the message names the input and how to fix it."""


def _content_text(content: Any) -> str:
    # OpenAI multi-part content: keep the text parts, in order.
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ValueError(
        f"message content must be a string or a list of text parts, got {content!r:.80}"
    )


def normalise_record(row: Any) -> list[dict[str, str]]:
    """Turn one raw record into a messages list; ValueError says what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"record is a {type(row).__name__}, expected a JSON object")
    messages = row.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        out = []
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages[{j}] must be an object with a string 'role'")
            try:
                out.append({"role": m["role"], "content": _content_text(m.get("content"))})
            except ValueError as e:
                raise ValueError(f"messages[{j}]: {e}") from None
        return out
    prompt, response = row.get("prompt"), row.get("response")
    if isinstance(prompt, str) and isinstance(response, str):
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    raise ValueError(f"record has neither {ACCEPTED_FIELDS}; its fields are {sorted(row)}")


class RecordSet:
    """Validated records of one source; `rs[i]` is a normalised messages list."""

    def __init__(
        self,
        source: str,
        index: np.ndarray,
        read: Callable[[int], Any],
        bad_rows: int,
    ) -> None:
        self.source = source
        self.bad_rows = bad_rows
        self._index = index  # int64 [n]: byte offset (jsonl) or row number (Arrow)
        self._read = read

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> list[dict[str, str]]:
        n = len(self._index)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for {n} records of {self.source}")
        return normalise_record(self._read(int(self._index[i])))

    def __repr__(self) -> str:
        return f"RecordSet({self.source!r}, n={len(self)}, bad_rows={self.bad_rows})"


def _bad(path: str, where: str, why: str) -> DataError:
    return DataError(f"{path}, {where}: {why}. Fix the row, or pass --skip-bad-rows to skip it.")


def _load_jsonl(path: str, skip_bad_rows: bool) -> RecordSet:
    offsets: list[int] = []
    bad = 0
    with open(path, "rb") as f:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue  # blank lines (e.g. a trailing newline) are not records
            try:
                normalise_record(json.loads(raw))
            except (ValueError, UnicodeDecodeError) as e:
                # json.JSONDecodeError is a ValueError: malformed JSON and missing
                # fields are both "bad rows".
                if not skip_bad_rows:
                    kind = "malformed JSON" if isinstance(e, json.JSONDecodeError) else "bad record"
                    raise _bad(path, f"line {lineno}", f"{kind}: {e}") from None
                bad += 1
                continue
            offsets.append(start)

    def read(offset: int) -> Any:
        with open(path, "rb") as f:
            f.seek(offset)
            return json.loads(f.readline())

    return RecordSet(path, np.asarray(offsets, dtype=np.int64), read, bad)


def _load_arrow(path: str, table: Any, skip_bad_rows: bool) -> RecordSet:
    """Validate a pyarrow Table in batches; rows are read back lazily by number."""
    names = set(table.column_names)
    if "messages" not in names and not {"prompt", "response"} <= names:
        raise DataError(
            f"{path}: no usable columns; need {ACCEPTED_FIELDS}, found {sorted(names)}."
        )
    rows: list[int] = []
    bad = 0
    for start in range(0, table.num_rows, _ARROW_BATCH):
        for k, row in enumerate(table.slice(start, _ARROW_BATCH).to_pylist()):
            try:
                normalise_record(row)
            except ValueError as e:
                if not skip_bad_rows:
                    raise _bad(path, f"row {start + k} (0-based)", f"bad record: {e}") from None
                bad += 1
                continue
            rows.append(start + k)

    def read(i: int) -> Any:
        return table.slice(i, 1).to_pylist()[0]

    return RecordSet(path, np.asarray(rows, dtype=np.int64), read, bad)


def _load_parquet(path: str, skip_bad_rows: bool) -> RecordSet:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, memory_map=True)
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: cannot read as Parquet ({e}).") from None
    return _load_arrow(path, table, skip_bad_rows)


def _load_saved_dataset(path: str, skip_bad_rows: bool) -> RecordSet:
    import datasets

    try:
        ds = datasets.load_from_disk(path)
    except Exception as e:  # FileNotFoundError or datasets' own errors
        raise DataError(
            f"{path}: not a folder written by datasets' save_to_disk ({e}). "
            "Pass a .jsonl or .parquet file, or a save_to_disk folder."
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = sorted(ds) or ["train"]
        raise DataError(
            f"{path} holds a DatasetDict with splits {splits}; pass one split's folder, "
            f"e.g. {os.path.join(path, splits[0])}."
        )
    # save_to_disk writes rows in dataset order (no indices mapping survives), so row i
    # of the underlying memory-mapped table is ds[i].
    table = ds.data.table
    if table.num_rows != len(ds):
        raise DataError(f"{path}: table has {table.num_rows} rows but dataset {len(ds)}.")
    return _load_arrow(path, table, skip_bad_rows)


def load_records(path: str | os.PathLike[str], *, skip_bad_rows: bool = False) -> RecordSet:
    """Load and validate a local dataset.

    `.jsonl` (one JSON object a line), `.parquet`, or a `save_to_disk` folder. A bad
    row raises DataError naming the file and line/row; with `skip_bad_rows` it is
    skipped and counted in `RecordSet.bad_rows`. An empty result raises DataError.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        records = _load_saved_dataset(path, skip_bad_rows)
    elif not os.path.exists(path):
        raise DataError(f"{path}: no such file or folder.")
    elif path.endswith(".jsonl"):
        records = _load_jsonl(path, skip_bad_rows)
    elif path.endswith(".parquet"):
        records = _load_parquet(path, skip_bad_rows)
    else:
        raise DataError(
            f"{path}: unsupported format; use a .jsonl file, a .parquet file, "
            "or a folder written by datasets' save_to_disk."
        )
    if len(records) == 0:
        skipped = f" ({records.bad_rows} bad rows skipped)" if records.bad_rows else ""
        raise DataError(f"{path}: dataset is empty{skipped}; need at least one record.")
    return records
