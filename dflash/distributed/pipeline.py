"""One rank of the target/drafter pipeline: process group, roles, start, faults.

Started by torchrun (one process per device; RANK/WORLD_SIZE/LOCAL_RANK in the
environment). Every rank runs its role's loop in its main thread: the only other
threads are the communication library's own, so compiled code is only ever traced and
run from the main thread (docs/algorithm.md#known-pitfalls: compile is not thread-safe).

Faults: every wait is bounded by --dist-timeout (process group and p2p polling), a rank
that fails prints one line naming itself, its role and the peer it was waiting on, and
exits hard (os._exit) so no rank lingers on a half-closed communicator; torchrun then
stops the rest and exits non-zero.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dflash import checkpoint as ckpt
from dflash.components import resolve_device
from dflash.config import TrainConfig
from dflash.distributed.roles import Layout, resolve_split
from dflash.run import StopFlag, catch_signals


def _device(cfg: TrainConfig) -> torch.device:
    device = resolve_device(cfg)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def _start(cfg: TrainConfig, layout: Layout, rank: int, device: torch.device):
    """Drafter 0 claims the run directory and finds the checkpoint; everyone learns the
    start step (or that drafter 0 refused, in which case all ranks stop)."""
    lead = layout.drafter_rank(0)
    record, last, status = None, None, torch.zeros(2, dtype=torch.int64, device=device)
    error: Exception | None = None
    if rank == lead:
        try:
            record = ckpt.claim_run_dir(
                Path(cfg.out), cfg.to_dict(), cfg.resume, TrainConfig.RESUMABLE_CHANGES
            )
            last = ckpt.latest_checkpoint(Path(cfg.out)) if cfg.resume else None
            step = ckpt.load_checkpoint(last)["step"] if last is not None else 0
            status[1] = step
        except Exception as e:  # shared with all ranks below, then re-raised here
            error = e
            status[0] = 1
    dist.broadcast(status, src=lead)
    if error is not None:
        raise error
    if int(status[0]):
        raise RuntimeError(f"{layout.name(lead)} refused to start (see its message)")
    step = int(status[1])
    if cfg.resume and rank != lead and layout.role(rank)[0] == "drafter":
        last = ckpt.latest_checkpoint(Path(cfg.out))
        if last is None or ckpt.load_checkpoint(last)["step"] != step:
            raise RuntimeError(
                f"checkpoint of step {step} not visible from this node under {cfg.out}: "
                "--out must be on a filesystem shared by all drafter ranks"
            )
    return step, last, record


def _pin(device: torch.device) -> int:
    """--pin-cpus: this rank's main thread runs on one CPU of its own, the LOCAL_RANK-th it
    may use, and every other thread it has by now (the communication library's, started
    with the process groups) on the rest; threads started later share the main thread's
    CPU (a drafter's receive poster, p2p.Receiver: it waits on the pair's lock in the
    main thread's stead). Returns the main thread's CPU.
    Why the main thread: beside another tenant, Linux's fair scheduler splits the cores
    evenly between an unpinned drafter and the tenant; pinned, the tenant mostly shares
    the core of the target rank, which sleeps on back-pressure.
    Why the other threads elsewhere: gloo's event loop takes a pair's lock with try_lock
    and, failing, returns to epoll_wait, which reports the same socket at once; the main
    thread holds that lock across the socket write of every send or receive it posts.
    Woken on the main thread's core, the loop preempts the lock holder and spins until
    the next tick gives the core back; on another core it cannot preempt it.
    Measured on 2 cores: docs/bench.md, "Pinning each rank to a core" and "The
    communication threads off the main thread's core". Opt-in: it is placement, and
    two pinned jobs on one host would share the same first CPUs."""
    if device.type != "cpu":
        raise ValueError(f"--pin-cpus is for CPU runs; this rank runs on {device}")
    cpus = sorted(os.sched_getaffinity(0))
    local, ranks = (
        int(os.environ.get("LOCAL_RANK", "0")),
        int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ["WORLD_SIZE"]),
    )
    if len(cpus) < ranks:
        raise ValueError(
            f"--pin-cpus needs a CPU per rank: {ranks} ranks on this node, CPUs allowed: "
            f"{len(cpus)}; drop --pin-cpus or run fewer ranks"
        )
    main, rest = cpus[local], set(cpus) - {cpus[local]}
    os.sched_setaffinity(0, {main})  # 0: the calling (main) thread, and those it starts later
    if rest:  # with one CPU allowed there is nowhere else to put the other threads
        me = threading.get_native_id()
        for tid in (int(t) for t in os.listdir("/proc/self/task")):
            if tid != me:
                with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
                    os.sched_setaffinity(tid, rest)
    return main


def run(cfg: TrainConfig, *, env_record=None, recipe=None, sim=None) -> dict[str, Any]:
    """Run this rank; returns its summary. Errors end the process with exit code 1.
    `sim`: a simulate.Profile whose waits stand in for the target forward and drafter step."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    targets, drafters = resolve_split(cfg.targets, cfg.drafters, world)
    layout = Layout(targets, drafters, cfg.grad_accum)
    me = layout.name(rank)
    flag = StopFlag()
    try:
        torch.manual_seed(cfg.seed)
        device = _device(cfg)
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=cfg.dist_timeout)
        dist.init_process_group(
            backend, timeout=timeout, device_id=device if device.type == "cuda" else None
        )
        drafter_ranks = [layout.drafter_rank(d) for d in range(drafters)]
        group = dist.new_group(drafter_ranks, timeout=timeout)  # every rank must call this
        ctrl_group = dist.new_group(list(range(world)), timeout=timeout, backend="gloo")
        if cfg.pin_cpus:  # after the groups: their communication threads exist, to be placed
            print(f"{me}: pinned to CPU {_pin(device)}", flush=True)
        step, last, record = _start(cfg, layout, rank, device)
        if rank == layout.drafter_rank(0):
            print(
                f"pipeline: {targets} targets + {drafters} drafters, {backend}, start step {step}"
            )
            if env_record is not None:
                ckpt.update_run_record(Path(cfg.out), environment=env_record)
            if recipe is not None:
                ckpt.update_run_record(Path(cfg.out), recipe=recipe)
        with catch_signals(flag):  # a signal stops the run at the next logging step
            if layout.role(rank)[0] == "target":
                from dflash.distributed.target_rank import run_target

                summary = run_target(cfg, layout, rank, device, step, ctrl_group, sim)
            else:
                from dflash.distributed.drafter_rank import run_drafter

                summary = run_drafter(
                    cfg,
                    layout,
                    rank,
                    device,
                    group,
                    ctrl_group,
                    step,
                    last,
                    record,
                    flag,
                    env_record,
                    sim,
                )
        dist.barrier()
        dist.destroy_process_group()
        if rank == layout.drafter_rank(0):
            how = "interrupted" if summary["interrupted"] else "finished"
            print(f"{how} at step {summary['step']}; run directory {cfg.out}", flush=True)
        return {"interrupted": False, **summary, "signal": flag.signum}
    except Exception as e:
        # One line that names this rank and its role (and, for a p2p failure, the peer),
        # then exit without running finalizers that could block on a broken peer.
        sys.stdout.flush()
        if os.environ.get("DFLASH_TRACEBACK"):
            traceback.print_exc()
        print(f"dflash train: {me} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
