"""Typed training configuration: one dataclass, presets as defaults, validated up front.

The CLI flags are generated from these fields (`--block-size` <-> `block_size`), so this
file is the single source of truth for flags, defaults and their validation.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dflash.export_dflash2 import DEFAULT_ALPHA, DFlash2Settings

# The tiny target: a random-weight Qwen3 small enough for CPU tests. Vocabulary comes
# from the locally built tokenizer, rounded up so padded rows exist (mask token rule).
TINY_TARGET: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        seq_len=256,
        block_size=8,
        max_anchors=16,
        draft_layers=2,
        lr=3e-3,
        max_steps=30,
        log_every=5,
        min_doc_len=16,
        max_doc_len=96,
        loss_chunk=512,
    ),
    # The paper's recipe (arXiv 2602.06036): Qwen3-8B target from a local HF directory.
    "qwen3-8b": dict(
        seq_len=3072,
        block_size=16,
        max_anchors=512,
        draft_layers=5,
        lr=6e-4,
        max_steps=10000,
        log_every=10,
        min_doc_len=256,
        max_doc_len=3072,
        loss_chunk=4096,
    ),
}


CHOICES: dict[str, tuple[str, ...]] = {
    "arch": ("dflash", "dflash2"),
    "attn": ("auto", "sdpa", "flex"),
    "device": ("auto", "cpu", "cuda"),
    "wandb": ("offline", "online", "off"),
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class ConfigError(ValueError):
    """A bad value of one field. `field` lets the caller say where the value came from
    (a flag or a recipe key); str() reads as the flag's error."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{_flag(field)} {message}")


def _typed(name: str, value: Any, hint: Any) -> Any:
    """`value` checked against the field's annotation (recipes bring TOML values, not
    argparse-converted ones); an int where a float is expected becomes that float."""
    args = (
        typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else ()
    )
    if value is None and type(None) in args:
        return None
    tp = next((a for a in args if a is not type(None)), hint) if args else hint
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise ConfigError(name, f"must be {tp.__name__}, got {value!r} ({type(value).__name__})")


def _from_preset(help: str) -> Any:
    """A field whose default, None, means "the preset's value": filled in before
    validation, so it is typed as its value and no code after __post_init__ sees None."""
    return field(default=None, metadata={"help": help})


@dataclass
class TrainConfig:
    out: str = field(metadata={"help": "run directory (metrics, checkpoints, drafter/)"})
    config: str | None = field(
        default=None,
        metadata={"help": "TOML recipe whose keys are these fields; flags override it"},
    )
    preset: str = field(default="tiny", metadata={"help": f"one of {sorted(PRESETS)}"})
    target: str | None = field(default=None, metadata={"help": "local HF target directory"})
    data: str = field(
        default="random", metadata={"help": "'random', or a .jsonl/.parquet/saved dataset path"}
    )
    max_steps: int = _from_preset("optimizer steps")
    seq_len: int = _from_preset("token budget per packed row")
    rows: int = field(default=1, metadata={"help": "packed rows per micro-batch"})
    block_size: int = _from_preset("drafter block size")
    max_anchors: int = _from_preset("anchors per row (static shape)")
    draft_layers: int = _from_preset("drafter decoder layers")
    arch: str = field(
        default="dflash",
        metadata={"help": "dflash | dflash2: in-block convolutions + candidate selector"},
    )
    # DFlash2 sizes (docs/dflash2.md); defaults: the published drafters'.
    conv_kernel_size: int = field(
        default=DFlash2Settings.conv_kernel_size, metadata={"help": "dflash2: taps per conv"}
    )
    conv_group_size: int = field(
        default=DFlash2Settings.conv_group_size,
        metadata={"help": "dflash2: channels sharing one dynamic tap"},
    )
    selector_rank: int = field(
        default=DFlash2Settings.selector_rank, metadata={"help": "dflash2: codebook rank"}
    )
    selector_top_k: int = field(
        default=DFlash2Settings.selector_top_k, metadata={"help": "dflash2: candidates per slot"}
    )
    selector_alpha: float = field(
        default=DEFAULT_ALPHA, metadata={"help": "dflash2: weight of the selector loss"}
    )
    num_target_features: int = field(default=5, metadata={"help": "target layers fused"})
    mask_token_id: int | None = field(default=None, metadata={"help": "override mask row"})
    lr: float = _from_preset("peak learning rate")
    min_lr_ratio: float = field(default=0.0, metadata={"help": "cosine floor / peak"})
    warmup_ratio: float = field(default=0.04, metadata={"help": "warmup share of steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "max grad norm (0 = off)"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per step"})
    loss_gamma: float | None = field(default=None, metadata={"help": "slot decay gamma"})
    loss_chunk: int = _from_preset("rows per CE chunk")
    seed: int = field(default=0, metadata={"help": "seed for init, data and anchors"})
    min_doc_len: int = _from_preset("random data: min doc length")
    max_doc_len: int = _from_preset("random data: max doc length")
    skip_bad_rows: bool = field(default=False, metadata={"help": "skip malformed rows"})
    log_every: int = _from_preset("steps between metric lines")
    save_every: int = field(default=0, metadata={"help": "steps between checkpoints (0=end)"})
    keep_last: int = field(default=3, metadata={"help": "checkpoints kept"})
    compile: bool = field(default=False, metadata={"help": "torch.compile drafter + masks"})
    attn: str = field(default="auto", metadata={"help": "auto | sdpa | flex"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda"})
    wandb: str = field(default="offline", metadata={"help": "offline | online | off"})
    resume: bool = field(default=False, metadata={"help": "continue the run in --out"})
    allow_dirty_env: bool = field(default=False, metadata={"help": "train despite doctor errors"})
    # Pipeline (dflash/distributed): one process per device, frozen targets feed training drafters.
    targets: int = field(default=0, metadata={"help": "target ranks (0 = split the world)"})
    drafters: int = field(default=0, metadata={"help": "drafter ranks (0 = split the world)"})
    max_in_flight: int = field(
        default=2, metadata={"help": "batches in flight per target->drafter link"}
    )
    dist_timeout: float = field(
        default=600.0, metadata={"help": "seconds before a silent peer fails the job"}
    )
    pin_cpus: bool = field(
        default=False,
        metadata={
            "help": "CPU pipeline: each rank's main thread on an allowed CPU of its own, its other threads on the rest"
        },
    )

    def __post_init__(self) -> None:
        self.preset = _typed("preset", self.preset, str)
        if self.preset not in PRESETS:
            raise ConfigError("preset", f"{self.preset!r} unknown; choose one of {sorted(PRESETS)}")
        # None, never 0, means "from the preset": an explicit 0 is validated like any value.
        for key, value in PRESETS[self.preset].items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            setattr(self, f.name, _typed(f.name, getattr(self, f.name), hints[f.name]))
        if self.preset != "tiny" and not self.target:
            raise ConfigError(
                "target",
                f"missing: preset {self.preset} trains against a local HF directory; set it "
                'with --target /models/Qwen3-8B, or target = "/models/Qwen3-8B" in the recipe',
            )
        positive: tuple[str, ...] = ("max_steps", "seq_len", "rows", "max_anchors")
        positive += ("draft_layers", "grad_accum", "lr", "loss_chunk", "log_every", "keep_last")
        positive += ("min_doc_len",)
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(name, f"must be > 0, got {getattr(self, name)}")
        if self.block_size < 2:
            raise ConfigError("block_size", f"must be >= 2, got {self.block_size}")
        if self.block_size > self.seq_len:
            raise ConfigError("block_size", f"{self.block_size} exceeds --seq-len {self.seq_len}")
        if self.max_doc_len < self.min_doc_len:
            raise ConfigError(
                "max_doc_len",
                f"must be >= --min-doc-len {self.min_doc_len}, got {self.max_doc_len}",
            )
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError("warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        if self.loss_gamma is not None and self.loss_gamma <= 0:
            raise ConfigError("loss_gamma", f"must be > 0, got {self.loss_gamma}")
        for name, options in CHOICES.items():
            if getattr(self, name) not in options:
                raise ConfigError(name, f"must be one of {options}, got {getattr(self, name)!r}")
        for name in ("save_every", "targets", "drafters", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.arch == "dflash2":
            from dflash.export import DrafterConfigError

            try:
                self.dflash2_settings()
            except DrafterConfigError as e:  # "DFlash2 conv_group_size: ..." names the key
                key = str(e).split()[1].rstrip(":")
                raise ConfigError(key, str(e).split(": ", 1)[1]) from None
        if self.selector_alpha < 0:
            raise ConfigError("selector_alpha", f"must be >= 0, got {self.selector_alpha}")
        if self.max_in_flight < 1:
            raise ConfigError("max_in_flight", f"must be >= 1, got {self.max_in_flight}")
        if self.dist_timeout <= 0:
            raise ConfigError("dist_timeout", f"must be > 0, got {self.dist_timeout}")

    @property
    def gamma(self) -> float:
        from dflash.loss import default_gamma

        return self.loss_gamma if self.loss_gamma is not None else default_gamma(self.block_size)

    def dflash2_settings(self) -> DFlash2Settings:
        return DFlash2Settings(
            self.conv_kernel_size, self.conv_group_size, self.selector_rank, self.selector_top_k
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # Fields that may change when resuming a run without making it "another run".
    RESUMABLE_CHANGES: ClassVar[tuple[str, ...]] = (
        "max_steps",
        "resume",
        "log_every",
        "save_every",
        "keep_last",
        "wandb",
    )
    RESUMABLE_CHANGES += ("allow_dirty_env", "out", "compile", "device", "attn", "config")
    # The number of targets never changes what is trained (see dflash/distributed/roles.py);
    # the number of drafters does (global batch = drafters x grad_accum micro-batches).
    RESUMABLE_CHANGES += ("targets", "max_in_flight", "dist_timeout", "pin_cpus")
