"""The drafter config.json format: one normaliser for every drafter config we write or read.

transformers 5 writes RoPE settings only as `rope_parameters`; transformers 4.57 ignores
that key and reads `rope_theta` (default 10000) and `rope_scaling`. A drafter saved by one
generation therefore builds a different model in the other, silently. So every config we
write states each setting in both spellings, and states the attention convention instead
of leaving readers to guess it from the layer type:

  rope_parameters            transformers 5 (rope_type, rope_theta, scaling fields)
  rope_theta, rope_scaling   transformers 4 (rope_scaling null unless the target scales)
  layer_types                per layer: full_attention | sliding_attention
  sliding_window, use_sliding_window, max_window_layers
                             the legacy statement of the same layer types
  is_causal: false           a drafter attends bidirectionally within its block; written
                             only when no layer slides (readers apply it to every layer)
  block_size                 also as dflash_config.block_size (readers look in either)
  dflash_config              mask_token_id, target_layer_ids, block_size,
                             causal_in_block (per layer, as trained: sliding layers are
                             causal inside the block, full layers are not),
                             sliding_window (when a layer slides)

`normalize` reads a config written by either transformers generation, by us, or by another
trainer in this format, and refuses (DrafterConfigError, naming the field) when two keys
disagree. `make_draft_config`, `DFlashDraftModel.save_pretrained/from_pretrained` and the
checkpoints all go through it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CONFIG_NAME = "config.json"
FULL, SLIDING = "full_attention", "sliding_attention"
# Keys a loader never needs and that change with the writer, not the model.
_WRITER_KEYS = ("transformers_version", "_name_or_path")


class DrafterConfigError(ValueError):
    """A drafter config that readers would build in different ways."""


def _refuse(source: str, field: str, why: str) -> DrafterConfigError:
    return DrafterConfigError(f"{source}: {field}: {why}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _rope(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The one RoPE statement of `raw` as transformers-5 `rope_parameters`."""
    params = raw.get("rope_parameters")
    theta = raw.get("rope_theta")
    if params is not None:
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            raise _refuse(
                source,
                "rope_parameters",
                "expected one flat dict (per-layer-type RoPE is unsupported)",
            )
        params = dict(params)
        if "rope_theta" in params and theta is not None and not _same(params["rope_theta"], theta):
            raise _refuse(
                source,
                "rope_theta",
                f"{theta} disagrees with rope_parameters.rope_theta {params['rope_theta']}",
            )
        params.setdefault("rope_theta", theta if theta is not None else 10000.0)
    else:
        params = {"rope_type": "default", "rope_theta": theta if theta is not None else 10000.0}
        scaling = raw.get("rope_scaling")
        if scaling:
            params.update(_legacy_scaling(scaling, source))
    params["rope_type"] = params.pop("type", None) or params.get("rope_type") or "default"
    if "rope_scaling" in raw:  # stated (null or a dict): it must say what rope_parameters says
        stated = _legacy_scaling(raw["rope_scaling"], source) if raw["rope_scaling"] else None
        if stated == {"rope_type": "default"}:  # 4.x's explicit spelling of plain RoPE
            stated = None
        implied = _scaling_of(params)
        if not _same(stated, implied):
            raise _refuse(
                source,
                "rope_scaling",
                f"{raw['rope_scaling']} disagrees with rope_parameters {params}",
            )
    return params


def _legacy_scaling(scaling: Any, source: str) -> dict[str, Any]:
    if not isinstance(scaling, dict):
        raise _refuse(source, "rope_scaling", f"expected a dict or null, got {scaling!r}")
    out = {k: v for k, v in scaling.items() if k not in ("type", "rope_theta")}
    out["rope_type"] = scaling.get("rope_type") or scaling.get("type") or "default"
    return out


def _scaling_of(params: dict[str, Any]) -> dict[str, Any] | None:
    """transformers-4 `rope_scaling` for these parameters: null for plain RoPE."""
    if params.get("rope_type", "default") == "default":
        return None
    return {k: v for k, v in params.items() if k != "rope_theta"}


def legacy_rope_keys(config) -> dict[str, Any]:
    """`rope_theta` and `rope_scaling` (transformers 4) for a Qwen3Config's rope_parameters:
    written next to them in any config.json we save, target or drafter."""
    params = dict(config.rope_parameters)
    return {"rope_theta": params["rope_theta"], "rope_scaling": _scaling_of(params)}


def add_legacy_rope_keys(config, directory: str | Path) -> Path:
    """Add `legacy_rope_keys` to the config.json transformers 5 wrote into `directory`."""
    path = Path(directory) / CONFIG_NAME
    raw = json.loads(path.read_text())
    raw.update(legacy_rope_keys(config))
    path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return path


def _legacy_types(n: int, use_sw: bool, window: int | None, mwl: int) -> list[str]:
    # The rule both Qwen3Config generations apply when layer_types is absent.
    return [SLIDING if use_sw and window is not None and i >= mwl else FULL for i in range(n)]


def _layers(raw: dict[str, Any], dcfg: dict[str, Any], source: str) -> dict[str, Any]:
    n = raw.get("num_hidden_layers")
    if not isinstance(n, int) or n < 1:
        raise _refuse(source, "num_hidden_layers", f"expected a positive integer, got {n!r}")
    window = raw.get("sliding_window")
    if "sliding_window" in dcfg:
        if window is not None and not _same(window, dcfg["sliding_window"]):
            raise _refuse(
                source,
                "sliding_window",
                f"{window} disagrees with dflash_config.sliding_window {dcfg['sliding_window']}",
            )
        window = dcfg["sliding_window"]
    types = raw.get("layer_types")
    use_sw = raw.get("use_sliding_window")
    mwl = raw.get("max_window_layers")
    if types is None:
        types = _legacy_types(n, bool(use_sw), window, n if mwl is None else mwl)
    types = list(types)
    if len(types) != n or not set(types) <= {FULL, SLIDING}:
        raise _refuse(
            source,
            "layer_types",
            f"expected {n} entries of {FULL}/{SLIDING} (num_hidden_layers {n}), got {types}",
        )
    sliding = SLIDING in types
    if sliding and types != _legacy_types(n, True, 0, types.index(SLIDING)):
        raise _refuse(
            source,
            "layer_types",
            f"{types}: sliding layers must come after every full layer, or transformers-4 "
            "readers (max_window_layers) build other layers",
        )
    if sliding and window is None:
        raise _refuse(
            source, "sliding_window", "null, but layer_types has sliding_attention layers"
        )
    if sliding and use_sw is False:
        raise _refuse(
            source,
            "use_sliding_window",
            "false, but layer_types has sliding_attention layers (transformers drops the window)",
        )
    if use_sw and mwl is not None and _legacy_types(n, True, window, mwl) != types:
        raise _refuse(
            source,
            "max_window_layers",
            f"{mwl} implies {_legacy_types(n, True, window, mwl)} but layer_types is {types}",
        )
    return {
        "layer_types": types,
        "sliding_window": window if sliding else None,
        "use_sliding_window": sliding,
        "max_window_layers": types.index(SLIDING) if sliding else n,
    }


def _causality(
    raw: dict[str, Any], dcfg: dict[str, Any], types: list[str], source: str
) -> list[bool]:
    trained = [t == SLIDING for t in types]  # what DFlashDraftModel computes (dflash.visibility)
    # Readers apply a top-level is_causal to every layer (z-lab's dflash 0.1.0 does), so it
    # is stated only when it holds for every layer: false, with no sliding layer.
    if raw.get("is_causal"):
        raise _refuse(
            source,
            "is_causal",
            "true, but a DFlash drafter attends bidirectionally within its block on full layers",
        )
    if raw.get("is_causal") is False and any(trained):
        raise _refuse(
            source,
            "is_causal",
            "false applies to every layer, but sliding_attention layers are causal within the "
            "block; drop it and state dflash_config.causal_in_block",
        )
    stated = dcfg.get("causal_in_block")
    if stated is None:
        if any(trained):
            raise _refuse(
                source,
                "dflash_config.causal_in_block",
                "missing; with sliding layers the in-block causality must be stated per layer",
            )
        return trained
    if list(stated) != trained:
        raise _refuse(
            source,
            "dflash_config.causal_in_block",
            f"{list(stated)}, but this drafter is causal in the block exactly on its "
            f"sliding_attention layers ({trained})",
        )
    return trained


def normalize(raw: dict[str, Any], source: str = "drafter config") -> dict[str, Any]:
    """The canonical (export) form of a drafter config dict, or DrafterConfigError."""
    dcfg = raw.get("dflash_config")
    if not isinstance(dcfg, dict):
        raise _refuse(source, "dflash_config", "missing; build the config with make_draft_config")
    for key in ("mask_token_id", "target_layer_ids"):
        if key not in dcfg:
            raise _refuse(source, f"dflash_config.{key}", "missing")
    block = raw.get("block_size")
    if "block_size" in dcfg:
        if block is not None and block != dcfg["block_size"]:
            raise _refuse(
                source,
                "block_size",
                f"{block} disagrees with dflash_config.block_size {dcfg['block_size']}",
            )
        block = dcfg["block_size"]
    if not isinstance(block, int) or block < 1:
        raise _refuse(source, "block_size", f"expected a positive integer, got {block!r}")

    out = {k: v for k, v in raw.items() if k not in _WRITER_KEYS}
    rope = _rope(raw, source)
    layers = _layers(raw, dcfg, source)
    causal = _causality(raw, dcfg, layers["layer_types"], source)
    new_dcfg = {
        **dcfg,
        "mask_token_id": int(dcfg["mask_token_id"]),
        "target_layer_ids": [int(i) for i in dcfg["target_layer_ids"]],
        "block_size": block,
        "causal_in_block": causal,
    }
    new_dcfg.pop("sliding_window", None)
    if layers["sliding_window"] is not None:
        new_dcfg["sliding_window"] = layers["sliding_window"]
    out.update(layers)
    out.update(
        rope_parameters=rope,
        rope_theta=rope["rope_theta"],
        rope_scaling=_scaling_of(rope),
        block_size=block,
        dflash_config=new_dcfg,
    )
    out.pop("is_causal", None)
    if not any(causal):
        out["is_causal"] = False
    out.setdefault("model_type", "qwen3")
    return out


def config_from_dict(raw: dict[str, Any], source: str = "drafter config"):
    """A Qwen3Config built from `raw` after normalisation (transformers-5 spelling only,
    so the running transformers never has to choose between two statements)."""
    from transformers import Qwen3Config

    fields = normalize(raw, source)
    for key in ("rope_theta", "rope_scaling", "model_type"):
        fields.pop(key)
    return Qwen3Config(**fields)


def export_dict(config) -> dict[str, Any]:
    """What we write as config.json for a drafter Qwen3Config."""
    # The diff drops only PretrainedConfig defaults (id2label, return_dict...), which
    # both generations share; every Qwen3Config field stays.
    raw = config.to_diff_dict()
    out = normalize(raw, "drafter config")
    if raw.get("transformers_version"):
        out["transformers_version"] = raw["transformers_version"]
    return dict(sorted(out.items()))


def write_config(config, directory: str | Path) -> Path:
    path = Path(directory) / CONFIG_NAME
    tmp = path.with_name(f".{CONFIG_NAME}.tmp")
    tmp.write_text(json.dumps(export_dict(config), indent=2) + "\n")
    tmp.replace(path)
    return path


def load_config(directory: str | Path):
    """The drafter Qwen3Config in `directory`/config.json (any writer), or a one-line error."""
    path = Path(directory) / CONFIG_NAME
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise DrafterConfigError(
            f"{path} not found: --drafter must be a drafter directory (RUN/drafter)"
        ) from None
    except json.JSONDecodeError as e:
        raise DrafterConfigError(f"{path}: not valid JSON ({e})") from None
    return config_from_dict(raw, str(path))
