"""`dflash train`: flags generated from TrainConfig, so the dataclass is the one source."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing

from dflash.config import PRESETS, TrainConfig


def _base_type(tp):
    """int | None -> int, bool -> bool, ..."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        tp = _base_type(hints[f.name])
        help_text = f.metadata.get("help", "")
        preset_default = {p: v[f.name] for p, v in PRESETS.items() if f.name in v}
        if preset_default:
            help_text += (
                " (preset: " + ", ".join(f"{p} {v}" for p, v in preset_default.items()) + ")"
            )
        if tp is bool:
            parser.add_argument(flag, action="store_true", help=help_text)
        elif f.default is dataclasses.MISSING:
            parser.add_argument(flag, type=tp, required=True, help=help_text)
        else:
            parser.add_argument(flag, type=tp, default=None, help=help_text)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    kwargs = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name) is not None
    }
    return TrainConfig(**kwargs)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        print(f"dflash train: {e}", file=sys.stderr)
        return 2
    from dflash.dist.launch import plan, self_launch

    try:  # one process, this rank of a torchrun job, or launch torchrun ourselves
        mode, nproc = plan(cfg)
    except ValueError as e:
        print(f"dflash train: {e}", file=sys.stderr)
        return 2
    if mode == "spawn":
        return self_launch(cfg, nproc)
    from dflash.checkpoint import RunDirError
    from dflash.data.sources import DataError
    from dflash.target import TargetMismatch
    from dflash.train import NonFiniteLoss, train

    env_record = _preflight(cfg)
    if env_record is None:
        return 3
    if mode == "rank":  # reports its own errors (naming rank and role) and exits 1
        from dflash.dist.pipeline import run as run_rank

        summary = run_rank(cfg, env_record=env_record)
        return 128 + (summary["signal"] or 0) if summary["interrupted"] else 0
    try:
        summary = train(cfg, env_record=env_record)
    except (RunDirError, DataError, TargetMismatch, NonFiniteLoss, ValueError) as e:
        print(f"dflash train: {e}", file=sys.stderr)
        return 1
    if summary["interrupted"]:
        print(f"stopped by signal {summary['signal']}; continue with --resume", file=sys.stderr)
        return 128 + (summary["signal"] or 0)
    return 0


def _preflight(cfg: TrainConfig):
    """Run the environment doctor before training; None means refuse to start."""
    from dflash.envcheck import configure_compile_caches
    from dflash.envcheck.preflight import DirtyEnvironment, preflight

    try:
        record = preflight(allow_dirty=cfg.allow_dirty_env)
    except DirtyEnvironment as e:
        print(f"dflash train: refusing to start on a dirty environment:\n{e}", file=sys.stderr)
        print("fix it as the report says, or pass --allow-dirty-env", file=sys.stderr)
        return None
    # Inductor/Triton caches keyed by this environment's fingerprint: a cache built in
    # another environment (other cuDNN, NCCL, torch) is never reused.
    record["compile_caches"] = configure_compile_caches(fingerprint=record["fingerprint"])
    return record
