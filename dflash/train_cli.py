"""`dflash train`: flags generated from TrainConfig, so the dataclass is the one source.

Values come from, in rising precedence: the preset, a recipe (`--config FILE`, or
./dflash.toml when present), the flags. With no recipe and no flags at all, the shipped
tiny recipe runs (a CPU check that training works here) and the end says how to write a
recipe for a real target.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
import typing
from datetime import UTC, datetime
from pathlib import Path

from dflash import recipes
from dflash.config import PRESETS, ConfigError, TrainConfig


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
        if f.name == "out":
            help_text += " (default: runs/<preset>-<UTC time>)"
        if f.name == "config":
            help_text += f" (default: ./{recipes.RECIPE_FILE} if present; shipped: "
            help_text += ", ".join(recipes.shipped()) + ")"
        # Every flag defaults to None = "not given", so a recipe's value stands unless a
        # flag overrides it; booleans get --no-X to override a recipe's true.
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, type=tp, default=None, help=help_text)
    parser.add_argument(
        "--show-recipe",
        metavar="NAME",
        help="print a shipped recipe and exit, e.g. `--show-recipe qwen3-8b > dflash.toml`",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        default=None,  # None when absent, so a bare `dflash train` stays bare
        help="print the GPU memory of one training step of this configuration and exit "
        "(nothing is loaded or trained; --target DIR needs only config.json, or Qwen/Qwen3-8B)",
    )


def default_out(preset: str) -> str:
    """runs/<preset>-<UTC time> under the working directory, never an existing one."""
    stem = f"runs/{preset}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    out, n = stem, 1
    while Path(out).exists():
        n += 1
        out = f"{stem}-{n}"
    return out


def _located(e: ConfigError, recipe: recipes.Recipe | None, flags: dict) -> str:
    """The error, naming the flag or the recipe file and key the bad value came from."""
    if recipe is None or e.field in flags:
        return str(e)
    return f"{recipe.path}: key {e.field!r} {e.message}"


def resolve(
    args: argparse.Namespace, check_paths: bool = True
) -> tuple[TrainConfig, recipes.Recipe | None]:
    """The config of this run and the recipe it came from. ValueError: one line.
    `check_paths=False`: target and data need not exist (--plan reads neither)."""
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    flags = {k: getattr(args, k) for k in fields if getattr(args, k, None) is not None}
    recipe = recipes.load(flags["config"]) if "config" in flags else None
    values = {**(recipe.values if recipe else {}), **flags}
    if recipe is not None:
        values["config"] = str(recipe.path)
    if "out" not in values:
        if values.get("resume"):
            raise ValueError("--resume continues the run in --out RUN: pass --out")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # each rank would pick its own time
            raise ValueError("under torchrun every rank needs the same run directory: pass --out")
        values["out"] = default_out(str(values.get("preset", "tiny")))
    try:
        cfg = TrainConfig(**values)
        if check_paths:
            check_local_paths(cfg)
    except ConfigError as e:
        raise ValueError(_located(e, recipe, flags)) from None
    return cfg, recipe


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return resolve(args)[0]


def parser(exit_on_error: bool = True) -> argparse.ArgumentParser:
    """`dflash train`'s flags on a parser of their own. exit_on_error=False, for a bench
    that checks the flags it will pass on: a bad value raises argparse.ArgumentError."""
    p = argparse.ArgumentParser(prog="dflash train", exit_on_error=exit_on_error)
    add_arguments(p)
    return p


def config_of(flags: list[str]) -> TrainConfig:
    """The config `dflash train FLAGS` would run, for benches and tests that build their
    own runs: one parse, so none of them drifts from the CLI. A bad value exits with
    argparse's one-line usage error; a bad combination raises ValueError naming the flag
    (resolve)."""
    return config_from_args(parser().parse_args(flags))


def check_local_paths(cfg: TrainConfig) -> None:
    """Missing local inputs fail now, not after minutes of loading a target."""
    if cfg.target and not Path(cfg.target).is_dir():
        raise ConfigError(
            "target", f"{cfg.target!r}: no such directory (a local HF model directory)"
        )
    if cfg.data != "random" and not Path(cfg.data).exists():
        raise ConfigError(
            "data", f"{cfg.data!r}: no such file or directory (or 'random' for random tokens)"
        )


NEXT_STEPS = """
That was the tiny preset on random tokens: a check that training works here.
To train a drafter for a real target, write a recipe (TOML; its keys are the flags of
`dflash train --help` with _ for -) and run `dflash train` where it is:
    dflash train --show-recipe qwen3-8b > dflash.toml
    # edit dflash.toml: target = "/models/Qwen3-8B", data = "regen.jsonl"
    dflash train                                  # reads ./dflash.toml
In the image, the working directory is the one mounted at /work:
    docker run --rm IMAGE train --show-recipe qwen3-8b > dflash.toml
    docker run --rm --gpus all -v "$PWD:/work" -v /models:/models IMAGE train"""


def run(args: argparse.Namespace) -> int:
    if args.show_recipe:
        try:
            print(recipes.text(args.show_recipe), end="")
        except recipes.RecipeError as e:
            print(f"dflash train: {e}", file=sys.stderr)
            return 2
        return 0
    bare = all(v is None for k, v in vars(args).items() if not k.startswith("_"))
    if args.config is None and args.resume and args.out:
        args.config = _started_from(Path(args.out))  # continue the run as it was started
    if args.config is None and Path(recipes.RECIPE_FILE).is_file():
        args.config = recipes.RECIPE_FILE
        bare = False
    elif bare:  # never a usage error: the tiny CPU run, then how to go further
        args.config = "tiny"
    try:
        if args.plan:  # memory of one step of this configuration; nothing is trained
            from dflash.memplan import plan as memory_plan

            print(memory_plan(resolve(args, check_paths=False)[0]).table())
            return 0
        cfg, recipe = resolve(args)
    except ValueError as e:
        print(f"dflash train: {e}", file=sys.stderr)
        return 2
    if recipe is not None:
        print(f"dflash train: recipe {recipe.path} (sha256 {recipe.sha256[:12]}), out {cfg.out}")
    from dflash.distributed.launch import plan, self_launch

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
    record = recipe.record() if recipe else None
    if mode == "rank":  # reports its own errors (naming rank and role) and exits 1
        from dflash.distributed.pipeline import run as run_rank

        summary = run_rank(cfg, env_record=env_record, recipe=record)
        return 128 + (summary["signal"] or 0) if summary["interrupted"] else 0
    try:
        summary = train(cfg, env_record=env_record, recipe=record)
    except (RunDirError, DataError, TargetMismatch, NonFiniteLoss, ValueError) as e:
        print(f"dflash train: {e}", file=sys.stderr)
        return 1
    if summary["interrupted"]:
        print(f"stopped by signal {summary['signal']}; continue with --resume", file=sys.stderr)
        return 128 + (summary["signal"] or 0)
    if bare:
        print(NEXT_STEPS)
    return 0


def _started_from(run_dir: Path) -> str | None:
    """The recipe file a run was started from, if it still exists (for --resume)."""
    from dflash.checkpoint import RUN_FILE

    try:
        path = json.loads((run_dir / RUN_FILE).read_text())["config"].get("config")
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return path if path and Path(path).is_file() else None


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
