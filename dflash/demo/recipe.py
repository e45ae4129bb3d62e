"""The demo recipe: every knob of the offline end-to-end run, and its cache key.

The target and its regenerated data depend only on the target/regen fields and on
the corpus (this interpreter's standard library), so they are cached under a hash
of exactly those; a second `dflash demo` skips straight to training the drafter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

RECIPE_VERSION = 3  # bump when the target/regen code changes what a recipe produces
CACHE_ENV = "DFLASH_DEMO_CACHE"


@dataclass(frozen=True)
class Recipe:
    # corpus: file shares (target pretraining, drafter prompts, eval prompts), chunking
    shares: tuple[int, int, int] = (80, 12, 8)
    prompt_chars: int = 240
    response_chars: int = 240
    # target
    vocab_size: int = 1024
    target_hidden: int = 128
    target_layers: int = 6
    target_steps: int = 400
    target_batch: int = 8
    target_seq_len: int = 256
    target_lr: float = 3e-3
    seed: int = 0
    # regenerated drafter data
    regen_prompts: int = 1024
    regen_max_new_tokens: int = 96
    regen_batch: int = 32
    # drafter (through dflash.train.train)
    block_size: int = 8
    draft_layers: int = 2
    num_target_features: int = 3
    draft_steps: int = 600
    draft_seq_len: int = 512
    draft_anchors: int = 48
    draft_lr: float = 3e-3
    checkpoints: int = 4  # tau-vs-step points
    # evaluation
    eval_prompts: int = 32
    curve_prompts: int = 8
    speedup_prompts: int = 8
    eval_max_new_tokens: int = 96

    TARGET_FIELDS = (
        "shares",
        "prompt_chars",
        "response_chars",
        "vocab_size",
        "target_hidden",
        "target_layers",
        "target_steps",
        "target_batch",
        "target_seq_len",
        "target_lr",
        "seed",
        "regen_prompts",
        "regen_max_new_tokens",
    )

    def cache_key(self) -> str:
        """Hash of what the cached target and data depend on (recipe part + corpus)."""
        part = {k: getattr(self, k) for k in self.TARGET_FIELDS}
        part["version"] = RECIPE_VERSION
        part["python"] = sys.version.split()[0]  # the corpus is this stdlib
        blob = json.dumps(part, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# A reduced recipe for the end-to-end test: same code path, minutes -> seconds.
QUICK = Recipe(
    target_steps=60,
    target_layers=6,
    target_hidden=64,
    vocab_size=512,
    regen_prompts=96,
    regen_max_new_tokens=48,
    draft_steps=60,
    draft_seq_len=256,
    draft_anchors=16,
    checkpoints=2,
    eval_prompts=4,
    curve_prompts=2,
    speedup_prompts=2,
    eval_max_new_tokens=32,
)
RECIPES = {"default": Recipe(), "quick": QUICK}


def cache_root(override: str | None = None) -> Path:
    if override:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "dflash" / "demo"
