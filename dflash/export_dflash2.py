"""The DFlash2 drafter format: what z-lab's published decoder (PyPI `dflash==0.1.0`,
`DFlash2DraftModel`) reads, on top of the DFlash format of dflash.export.

config.json is a DFlash drafter config (dflash.export.normalize: both RoPE spellings,
layer types, block_size, dflash_config) with
  architectures              ["DFlash2DraftModel"]: the class their loader picks
  dflash_config.conv_kernel_size, .conv_group_size, .selector_rank, .selector_top_k
                             where the published drafters state them; the decoder reads
                             dflash_config first and the top level second, so a config
                             with a top-level copy (speculators' flat fields) must agree

model.safetensors adds, per decoder layer i, and once for the selector:
  layers.i.attention_conv.base_kernel             [2, kernel, hidden]
  layers.i.attention_conv.kernel_projection.weight [2 * kernel * groups, hidden]
  layers.i.mlp_conv.base_kernel, layers.i.mlp_conv.kernel_projection.weight
  candidate_selector.predecessor_codebook          [vocab, rank]  (no ".weight": the
  candidate_selector.successor_codebook            [vocab, rank]   published tensor names)
  candidate_selector.hidden_projection.weight      [rank, hidden]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dflash.export import DrafterConfigError

ARCHITECTURE = "DFlash2DraftModel"
KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# The selector loss weight: speculators --selector-loss-alpha and NeMo selector_loss_weight.
DEFAULT_ALPHA = 1.0


@dataclass(frozen=True)
class DFlash2Settings:
    """The four DFlash2 sizes. Defaults are the published Qwen3.8-27B-DFlash2 values
    (two taps, 16-channel groups, rank 256, top 16), also the defaults of the
    speculators trainer (PR #1006)."""

    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16

    def __post_init__(self):
        for key in KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DrafterConfigError(
                    f"DFlash2 {key}: expected a positive integer, got {value!r}"
                )

    def check(self, *, hidden_size: int, block_size: int, vocab_size: int) -> None:
        """Refuse sizes the model cannot be built with, naming the key."""
        if hidden_size % self.conv_group_size:
            raise DrafterConfigError(
                f"DFlash2 conv_group_size: {self.conv_group_size} does not divide "
                f"hidden_size {hidden_size}; pick a divisor"
            )
        if self.conv_kernel_size > block_size:
            raise DrafterConfigError(
                f"DFlash2 conv_kernel_size: {self.conv_kernel_size} taps exceed block_size "
                f"{block_size}; the convolution never crosses a block"
            )
        if self.selector_top_k > vocab_size:
            raise DrafterConfigError(
                f"DFlash2 selector_top_k: {self.selector_top_k} exceeds vocab_size {vocab_size}"
            )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def settings_of(config: Any, source: str = "drafter config") -> DFlash2Settings:
    """The DFlash2 settings a config (a dict or a PretrainedConfig) states, read the way
    the published decoder reads them: dflash_config first, then the top level."""
    raw = config if isinstance(config, dict) else config.to_dict()
    dcfg = raw.get("dflash_config") or {}
    values = {}
    for key in KEYS:
        inner, outer = dcfg.get(key), raw.get(key)
        if inner is not None and outer is not None and inner != outer:
            raise DrafterConfigError(
                f"{source}: {key}: {outer} disagrees with dflash_config.{key} {inner}"
            )
        value = inner if inner is not None else outer
        if value is None:
            raise DrafterConfigError(
                f"{source}: dflash_config.{key}: missing; a DFlash2 drafter states "
                f"{', '.join(KEYS)} (build it with dflash.model_dflash2.make_dflash2_config)"
            )
        values[key] = value
    return DFlash2Settings(**values)


def is_dflash2(config: Any) -> bool:
    raw = config if isinstance(config, dict) else config.to_dict()
    return ARCHITECTURE in (raw.get("architectures") or [])


def published_weight_names(config: Any) -> set[str]:
    """The tensor names, beyond DFlash's, that the published decoder loads."""
    n = config["num_hidden_layers"] if isinstance(config, dict) else config.num_hidden_layers
    per_layer = ("base_kernel", "kernel_projection.weight")
    names = {
        f"layers.{i}.{conv}.{p}"
        for i in range(n)
        for conv in ("attention_conv", "mlp_conv")
        for p in per_layer
    }
    selector = ("predecessor_codebook", "successor_codebook", "hidden_projection.weight")
    return names | {f"candidate_selector.{p}" for p in selector}
