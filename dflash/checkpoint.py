"""Run directories and checkpoints: atomic writes, keep-last-K, exact resume.

A checkpoint is a directory `checkpoints/step_XXXXXXXX/` holding `state.pt` (model,
optimizer, scheduler, RNG, data position, step) and the drafter's `config.json` in the
export format (dflash.export), which `--resume` checks against the drafter it rebuilds. It is written under a temporary name
and renamed into place, so a crash mid-write never leaves a half checkpoint that
`latest_checkpoint` would pick.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from dflash import export

RUN_FILE = "run.json"
CKPT_DIR = "checkpoints"
PREFIX = "step_"


class RunDirError(ValueError):
    pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def claim_run_dir(
    run_dir: Path, config: dict[str, Any], resume: bool, may_change: tuple[str, ...]
) -> dict[str, Any]:
    """Create or reopen a run directory; refuse to mix two runs in one directory.

    Returns the stored run record (config plus ids such as the wandb run id).
    """
    run_file = run_dir / RUN_FILE
    if run_file.exists():
        stored = json.loads(run_file.read_text())
        if not resume:
            raise RunDirError(
                f"{run_dir} already holds a run (see {run_file}). Pass --resume to continue "
                "it, or choose another --out."
            )
        diffs = {
            k: (stored["config"].get(k), v)
            for k, v in config.items()
            if k not in may_change and stored["config"].get(k) != v
        }
        if diffs:
            lines = ", ".join(
                f"--{k.replace('_', '-')}: {a!r} -> {b!r}" for k, (a, b) in diffs.items()
            )
            raise RunDirError(f"--resume with a different configuration than {run_file}: {lines}")
        stored["config"] = config
        write_json_atomic(run_file, stored)
        return stored
    if resume:
        raise RunDirError(f"--resume given but {run_dir} holds no run ({RUN_FILE} missing)")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunDirError(
            f"{run_dir} is not empty and is not a dflash run directory; choose another --out"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"config": config}
    write_json_atomic(run_file, record)
    return record


def update_run_record(run_dir: Path, **fields: Any) -> None:
    path = run_dir / RUN_FILE
    record = json.loads(path.read_text())
    record.update(fields)
    write_json_atomic(path, record)


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / CKPT_DIR
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / "state.pt").exists()]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def save_checkpoint(
    run_dir: Path, step: int, state: dict[str, Any], keep_last: int, drafter_config=None
) -> Path:
    root = run_dir / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with open(tmp / "state.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if drafter_config is not None:
        export.write_config(drafter_config, tmp)
    if final.exists():  # re-saving the same step (e.g. signal right after a save)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, drafter_config=None) -> dict[str, Any]:
    """The checkpoint's state; with `drafter_config` (the drafter rebuilt for --resume),
    refuse when the checkpoint's config.json describes another drafter."""
    if drafter_config is not None and (path / export.CONFIG_NAME).exists():
        check_same_drafter(export.load_config(path), drafter_config, path)
    # Our own file: it holds RNG states and optimizer state, not only tensors.
    return torch.load(path / "state.pt", map_location="cpu", weights_only=False)


def check_same_drafter(stored, rebuilt, where: Path) -> None:
    a, b = export.export_dict(stored), export.export_dict(rebuilt)
    a.pop("transformers_version", None)
    b.pop("transformers_version", None)
    diffs = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    if diffs:
        k = diffs[0]
        raise RunDirError(
            f"--resume: {where}/{export.CONFIG_NAME} {k} is {a.get(k)!r} but this run builds "
            f"{b.get(k)!r}: resume with the target and settings the run started with"
        )


def export_drafter(model, run_dir: Path) -> Path:
    """Write the drafter in the loader format to RUN/drafter/ atomically."""
    final = run_dir / "drafter"
    tmp = run_dir / ".drafter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final
