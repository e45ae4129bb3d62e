"""Named benchmark workloads: everything that decides what one step computes.

A workload fixes the model shapes, the topology (targets, drafters), the token budget,
max_anchors, block size, the step counts and the intra-op threads. Its hash is the
sha256 of that definition: two records are comparable only when their hashes match,
so editing a workload (even keeping its name) can never pass as a speed change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dflash.bench.reference import REFERENCE_VERSION
from dflash.config import TINY_TARGET

# Qwen3-8B dimensions (its published config.json): throughput depends on shapes, not
# on trained weights, so the target is built from this config with random weights.
QWEN3_8B_TARGET: dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=4096,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=12288,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)


# May differ between comparable records: how many samples, when to stop, what counts.
POLICY_FIELDS = ("repeats", "min_effect", "steady_budget_s", "pair_mode")
PAIR_MODES = ("concurrent", "sequential")


@dataclass(frozen=True)
class Workload:
    name: str
    device: str  # "cpu" | "cuda"
    target: dict[str, Any]  # Qwen3Config fields; vocab_size None = tiny tokenizer padded
    draft_layers: int
    seq_len: int  # token budget per packed row
    rows: int
    block_size: int
    max_anchors: int
    targets: int = 1
    drafters: int = 1
    warmup_steps: int = 3
    steps: int = 20
    repeats: int = 5
    threads: int | None = None  # torch intra-op threads; None = the process default
    compile: bool = False
    attn: str = "auto"
    # "wall": tokens per wall-clock second. "cpu": tokens per CPU-second of the process,
    # for shared CPU hosts where other tenants' load would otherwise be the signal
    # (a single-threaded workload's CPU time does not grow when it is descheduled).
    metric: str = "wall"
    # CPU metric only: after every steady step run the machine-speed reference
    # (dflash/bench/reference.py, this version of it; 0 = none) and compare throughput
    # corrected by its time, so the shared host's drifting speed cancels out.
    reference: int = 0
    # Exponent of the correction (see reference.py): measured, per workload and host kind.
    reference_power: float = 1.0
    # False: target and drafter in one process. True: dflash.distributed ranks under torchrun.
    pipeline: bool = False
    # A repeat's sample: this quantile of its steady steps' throughput. 0.5 (median)
    # for dedicated machines; higher on shared CPUs, where contention only ever slows
    # a step down, so the fast steps estimate the uncontended speed.
    sample_quantile: float = 0.5
    # Smallest ratio change that counts (with significance) as a regression: a policy,
    # not part of what is measured, so outside the hash like `repeats`.
    min_effect: float = 0.05
    # Wall seconds after which a repeat ends its steady phase early (once it has
    # MIN_STEADY_STEPS): a sample is a quantile of steps, so fewer steps estimate the
    # same number. Bounds a run on a catastrophically slow environment (0 = no bound).
    steady_budget_s: float = 0.0
    # Paired runs: "concurrent" runs a pair's candidate and baseline repeats at the same
    # time, one per core, so the shared host's drift is the same for both (one-thread
    # CPU workloads; runner.concurrent_pairs); "sequential" back to back. Policy: how
    # the samples are scheduled, not what one measures.
    pair_mode: str = "sequential"
    min_doc_len: int = 64
    max_doc_len: int = 512
    seed: int = 0
    notes: str = field(default="", compare=False)

    @property
    def topology(self) -> str:
        return f"{self.targets}T+{self.drafters}D/{'pipeline' if self.pipeline else 'colocated'}"

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.rows * self.drafters

    def definition(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("notes")
        return d

    def hash(self) -> str:
        """What one sample measures. `repeats` and `min_effect` are left out: more
        repeats give more samples of the same quantity, and stay comparable."""
        d = self.definition()
        for policy in POLICY_FIELDS:
            d.pop(policy)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def with_changes(self, **changes: Any) -> Workload:
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        if self.metric not in ("wall", "cpu"):
            raise ValueError(f"workload {self.name}: metric must be 'wall' or 'cpu'")
        if self.reference and (self.metric != "cpu" or self.pipeline):
            raise ValueError(
                f"workload {self.name}: reference needs metric 'cpu' in one process "
                "(it corrects CPU time for a shared host's speed)"
            )
        if self.pair_mode not in PAIR_MODES:
            raise ValueError(f"workload {self.name}: pair_mode must be one of {PAIR_MODES}")
        if self.reference_power <= 0:
            raise ValueError(f"workload {self.name}: reference_power must be > 0")
        if self.reference not in (0, REFERENCE_VERSION):
            raise ValueError(
                f"workload {self.name}: reference version {self.reference} is not this "
                f"checkout's ({REFERENCE_VERSION}); 0 turns it off"
            )

    @property
    def metric_key(self) -> str:
        if self.reference:
            return "tok_per_ref"
        return "tok_per_cpu_s" if self.metric == "cpu" else "tok_per_s"

    @property
    def unit(self) -> str:
        if self.reference:
            return "tok/cpu-s@ref"  # at the reference's nominal host speed
        return "tok/cpu-s" if self.metric == "cpu" else "tok/s"

    @classmethod
    def from_definition(cls, d: dict[str, Any]) -> Workload:
        return cls(**d)


# CI on 2 shared cores: small enough for 10 repeats in well under 3 minutes (~37 s
# here), large enough that matmuls and attention, not Python overhead alone, set the
# pace. Ten repeats, the median of each, correction power 2 and a 7% minimum effect:
# on this machine's quality runs (docs/bench.md) that flagged no unchanged run, also
# against a baseline from an hour earlier, and 9-10 of 10 runs of each 9-11% change.
_TINY_CPU = Workload(
    name="tiny-cpu",
    device="cpu",
    target={**TINY_TARGET, "vocab_size": None},
    draft_layers=2,
    seq_len=512,
    rows=2,
    block_size=8,
    max_anchors=32,
    warmup_steps=3,
    steps=30,
    repeats=10,
    threads=1,
    metric="cpu",
    reference=REFERENCE_VERSION,
    reference_power=2.0,
    sample_quantile=0.5,
    min_effect=0.07,
    steady_budget_s=60.0,  # ~3 s normally; a GIL-holding thread made steps 70x slower
    pair_mode="concurrent",
    min_doc_len=32,
    max_doc_len=192,
    notes="tiny Qwen3 target (hidden 64), 2-layer drafter, one thread, host-speed corrected",
)


WORKLOADS: dict[str, Workload] = {
    "tiny-cpu": _TINY_CPU,
    # The multi-process pipeline on CPU: one target rank and one drafter rank (gloo),
    # tiny models, one thread each. Wall-clock: two processes share the cores.
    "tiny-cpu-pipe": dataclasses.replace(
        _TINY_CPU,
        name="tiny-cpu-pipe",
        steps=20,
        repeats=3,
        pipeline=True,
        metric="wall",
        reference=0,
        sample_quantile=0.5,
        min_effect=0.10,  # wall-clock on shared cores: for local use, not a CI gate
        pair_mode="sequential",  # two ranks per repeat: a pair at once would need 4 cores
        notes="tiny-cpu's shapes as a 1-target + 1-drafter torchrun pipeline",
    ),
    # The paper recipe's shapes on one GPU, target and drafter colocated (1T+1D):
    # Qwen3-8B target (random bf16 weights), 5-layer drafter, 3072-token rows,
    # 512 anchors, block 16. Nothing is downloaded.
    "qwen3-8b-1gpu": Workload(
        name="qwen3-8b-1gpu",
        device="cuda",
        target=dict(QWEN3_8B_TARGET),
        draft_layers=5,
        seq_len=3072,
        rows=1,
        block_size=16,
        max_anchors=512,
        warmup_steps=5,
        steps=30,
        repeats=3,
        compile=True,
        attn="flex",
        min_doc_len=256,
        max_doc_len=3072,
        notes="Qwen3-8B-shaped target and drafter with random weights, one GPU",
    ),
}


def get_workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; choose one of {sorted(WORKLOADS)}")
    return WORKLOADS[name]


def describe_difference(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Fields that differ between two workload definitions, as 'field: a -> b'."""
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
