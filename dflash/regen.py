"""Regenerate responses with the target itself (greedy), as drafter training data.

The drafter must learn the target's own distribution (docs/algorithm.md#data),
so every prompt's response is replaced by the target's temperature-0 output. Two
backends produce the same rows:

* local: a HF directory, batched greedy `generate` (left padding, KV cache);
* server: an OpenAI-compatible `/v1/chat/completions` (vLLM, SGLang) for big targets.

Output is JSONL in `messages` form, one row per prompt, in prompt order. It is
resumable: rows are appended and fsynced per batch, a torn last line is cut off on
restart, and prompts whose id is already in the file are skipped, so an interrupted
run neither loses nor duplicates rows.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from tqdm import tqdm

from dflash.data.prompts import Messages, load_prompt_rows


def done_ids(out_path: str) -> set[str]:
    """Ids already written; a torn last line (crash mid-write) is cut off first."""
    if not os.path.exists(out_path):
        return set()
    with open(out_path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1  # everything after the last newline is torn
        if keep < len(data):
            f.truncate(keep)
    return {str(json.loads(line)["id"]) for line in data[:keep].splitlines() if line.strip()}


class LocalGenerator:
    """Batched greedy decoding with a local HF target (left padding, KV cache)."""

    def __init__(self, target_dir: str, *, max_new_tokens: int, device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
        self.tok.padding_side = "left"  # generated tokens must follow the prompt directly
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(
            target_dir, local_files_only=True, dtype=dtype, attn_implementation="sdpa"
        ).to(device)  # type: ignore[arg-type]  # transformers' .to wrapper is typed for models
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        from dflash.target import eos_ids_of

        self.eos = eos_ids_of(self.tok, self.model)
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else min(self.eos)

    @torch.no_grad()
    def __call__(self, batch: list[Messages]) -> list[tuple[str, str]]:
        texts = [
            self.tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
            for m in batch
        ]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = enc.to(self.model.device)
        gen = self.model.generate(
            **enc,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(self.eos),
            pad_token_id=self.pad,
        )
        out = []
        for row in gen[:, enc["input_ids"].shape[1] :].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)
            ids = row if stop is None else row[:stop]
            reason = "length" if stop is None else "stop"
            out.append((str(self.tok.decode(ids, skip_special_tokens=True)), reason))
        return out


class ServerGenerator:
    """An OpenAI-compatible chat endpoint at temperature 0 (vLLM, SGLang, ...)."""

    def __init__(
        self,
        url: str,
        *,
        max_new_tokens: int,
        model: str | None = None,
        concurrency: int = 8,
        timeout: float = 600.0,
    ):
        self.base = url.rstrip("/").removesuffix("/v1")
        self.max_new_tokens = max_new_tokens
        self.timeout = timeout
        self.concurrency = concurrency
        self.model = model or self._first_model()

    def _request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except OSError as e:  # URLError, HTTPError, timeouts
            raise ConnectionError(f"{self.base + path}: {e}. Is the server running?") from None

    def _first_model(self) -> str:
        models = self._request("/v1/models").get("data") or []
        if not models:
            raise ConnectionError(f"{self.base}/v1/models lists no model; pass --server-model")
        return str(models[0]["id"])

    def _one(self, messages: Messages) -> tuple[str, str]:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": self.max_new_tokens,
            "stream": False,
        }
        choice = self._request("/v1/chat/completions", body)["choices"][0]
        return choice["message"]["content"] or "", choice.get("finish_reason") or "stop"

    def __call__(self, batch: list[Messages]) -> list[tuple[str, str]]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self._one, batch))  # map keeps prompt order


def _batches(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def regenerate(
    prompts_path: str,
    out_path: str,
    generate,
    *,
    batch_size: int,
    limit: int | None = None,
    stop_after_batches: int | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Write one `messages` row per prompt not yet in `out_path`. `stop_after_batches`
    simulates an interruption (tests)."""
    rows = load_prompt_rows(prompts_path)[:limit]
    done = done_ids(out_path)
    todo = [r for r in rows if r[0] not in done]
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    stats = {"prompts": len(rows), "skipped": len(rows) - len(todo), "written": 0, "cut": 0}
    bar = tqdm(total=len(todo), desc="regen", unit="prompt", disable=not progress)
    with open(out_path, "a") as f:
        for n, batch in enumerate(_batches(todo, batch_size)):
            if stop_after_batches is not None and n >= stop_after_batches:
                break
            results = generate([m for _, m in batch])
            for (rid, messages), (text, reason) in zip(batch, results, strict=True):
                row = {"id": rid, "messages": [*messages, {"role": "assistant", "content": text}]}
                f.write(json.dumps(row | {"finish_reason": reason}) + "\n")
                stats["cut"] += reason == "length"
            f.flush()
            os.fsync(f.fileno())  # a batch is either fully on disk or regenerated
            stats["written"] += len(batch)
            bar.update(len(batch))
    bar.close()
    return stats
