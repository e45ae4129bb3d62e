"""How `dflash train` runs: one process, this rank of a torchrun job, or a self-launch.

  - Under torchrun (WORLD_SIZE > 1): this process is one rank of the pipeline.
  - --targets T --drafters D given, or several visible GPUs: re-run `dflash train` under
    `torchrun --standalone --nproc-per-node N` (N = T + D, or all GPUs split 5:3), so
    `docker run --gpus all ... dflash train` uses every GPU with no launcher of its own.
  - Otherwise: the single-process trainer, unchanged.

`python -m dflash.distributed.rank_cli FLAGS` runs one rank without the environment preflight
(for tests and benchmarks that build their own torchrun command).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from dflash.config import TrainConfig


def plan(cfg: TrainConfig) -> tuple[str, int]:
    """("rank" | "spawn" | "single", number of processes)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "rank", int(os.environ["WORLD_SIZE"])
    if cfg.targets and cfg.drafters:
        n = cfg.targets + cfg.drafters
        return ("spawn", n) if n > 1 else ("single", 1)
    gpus = 0
    if cfg.device != "cpu":
        import torch

        gpus = torch.cuda.device_count()
    if gpus >= 2:
        return "spawn", gpus
    if cfg.targets or cfg.drafters:
        raise ValueError(
            "--targets and --drafters go together without GPUs (or set neither); "
            f"got --targets {cfg.targets} --drafters {cfg.drafters}"
        )
    return "single", 1


def config_argv(cfg: TrainConfig) -> list[str]:
    """Flags that rebuild `cfg` exactly (presets already resolved into the fields)."""
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):  # --no-X too: a false flag must override a recipe's true
            argv += [flag if value else "--no-" + flag[2:]]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def torchrun_command(cfg: TrainConfig, nproc: int, module: str = "dflash.cli") -> list[str]:
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    head += ["--nproc-per-node", str(nproc), "-m", module]
    return head + (["train"] if module == "dflash.cli" else []) + config_argv(cfg)


def self_launch(cfg: TrainConfig, nproc: int) -> int:
    """Run the job under torchrun on this machine and return its exit code."""
    cmd = torchrun_command(cfg, nproc)
    print("dflash train: launching " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    return subprocess.call(cmd, env=worker_env())


def worker_env() -> dict[str, str]:
    """The environment for a torchrun job on this machine: this one, with one intra-op
    thread per rank unless OMP_NUM_THREADS says otherwise (the ranks share the cores)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def child_pids(parent: int) -> list[int]:
    """The pids of the running processes whose parent is `parent`, read from /proc (Linux)."""
    found = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:  # field 4: ppid
                found.append(pid)
        except (OSError, IndexError, ValueError):  # gone, or not ours to read
            continue
    return found


def worker_pids(torchrun_pid: int) -> dict[int, int]:
    """{global RANK: pid} of the worker processes a running torchrun has started, read
    from /proc (Linux): for tests and benchmarks that watch the ranks of a job."""
    found = {}
    for pid in child_pids(torchrun_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                found[int(kv[5:])] = pid
    return found
