"""How fast the same drafter step runs, and what changes it: the probes behind the quiet
1 + 1 efficiency (docs/bench.md, "Where the quiet 6% is not").

Each mode times the trainer's own step (dflash.step.train_step, the capacity's stage
alone: dflash/bench/capacity.py) in short blocks, as the median thread CPU time per step,
so that a block is not charged for time its thread spent off the CPU. Conditions
alternate block by block (the host's speed drifts within seconds), and each prints the
per-round ratio's median with its distribution-free 95% interval as its last line (JSON;
the interval from 6 rounds on). A ratio above 1 means the step took more CPU time.

    .venv/bin/python bench/step_speed.py cpus --rounds 30          # CPU 1 over CPU 0
    .venv/bin/python bench/step_speed.py beside target --rounds 60  # other CPU busy / idle
    .venv/bin/python bench/step_speed.py processes 6 --rounds 40    # each / the round's median
    .venv/bin/python bench/step_speed.py inputs --rounds 40         # pipeline's / capacity's

- `cpus`: one process, pinned to one CPU, then the other, then the first again (which
  goes first alternates by round): the second CPU over the first (over the geometric
  mean of the first's two blocks, which bracket it in time) and, as the control, the
  first CPU's second block over its first, as far apart in time. If the two CPUs ran at
  one speed that drifts, both would spread alike. Each block's median is printed (ms).
- `beside NEIGHBOUR`: pinned to one CPU while the other one is idle or runs a neighbour
  (`target`: the target's forward in a loop, what the other rank runs in a 1 + 1
  pipeline; `busy`: a pure-Python loop), switched by SIGSTOP/SIGCONT; the two CPUs swap
  every two rounds. `waker` runs on the step's own CPU instead: it wakes every 5 ms and
  copies 256 KB, so the step is preempted about 200 times a second and loses that much
  cache each time (a pipeline drafter's main thread: about 100 preemptions a second).
- `processes K`: K processes built alike, a block each per round in random order, all on
  the same CPU in a round: does where a process's memory landed change its speed?
- `inputs`: micro-batches as the capacity times them (a fixed set of 30, every one as
  batch 0) against what a pipeline drafter trains on: each batch's own index (its own
  anchors), fresh batches from the stream, and fresh batches read as views of a message
  buffer in dflash/distributed/p2p.py's layout (packed untimed just before each step on
  the same CPU) and, with 2 CPUs, that message packed on the other CPU, as gloo's thread
  there leaves it under --pin-cpus, and read on the step's (over the same-CPU one).
  Pinned to one CPU per round, alternating.

Every child process is killed when this one dies, however it dies (Linux's parent-death
signal), so no busy neighbour outlives a killed probe.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from dflash.bench.capacity import on_cpu
from dflash.bench.envs import exit_on_signal
from dflash.bench.stats import median_interval

BLOCK = 20  # timed steps per block: ~0.3-0.5 s of the tiny preset on this class of host
WARM = 2  # untimed steps first: the caches after a switch of CPU or condition
PR_SET_PDEATHSIG = 1  # prctl(2)


def _config(extra: list[str] | None = None):
    from dflash.train_cli import config_of

    # --out is required, but Stages and build_run never write to it: nothing is left behind
    with tempfile.TemporaryDirectory(prefix="dflash-step-speed-") as out:
        return config_of(["--wandb", "off", "--out", out, *(extra or [])])


def _stages(batches: int = BLOCK):
    from dflash.bench.capacity import Stages

    return Stages(_config(), batches=batches)


def block(
    step: Callable[[Any], None], n: int = BLOCK, prepare: Callable[[int], Any] = lambda i: i
) -> float:
    """Median thread CPU seconds of `step(prepare(i))` over n calls, after WARM untimed
    ones; `prepare` runs untimed."""
    for i in range(WARM):
        step(prepare(i))
    times = []
    for i in range(WARM, WARM + n):
        x = prepare(i)
        t = time.thread_time()
        step(x)
        times.append(time.thread_time() - t)
    return statistics.median(times)


def _stages_step(st) -> Callable[[int], None]:
    data = st.data[st.warmup :]
    return lambda i: st._train_one(data[i % len(data)])


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))[:2]


def summary(name: str, ratios: list[float], **extra) -> dict:
    ci = median_interval(ratios)
    return {
        "probe": name,
        "rounds": len(ratios),
        "ratios": [round(r, 3) for r in ratios],
        "median": round(statistics.median(ratios), 3),
        "ci95": [round(x, 3) for x in ci] if ci else None,
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
        "rounds_more_than_10pct_apart": sum(abs(r - 1) > 0.1 for r in ratios),
        **extra,
    }


def _child(cmd: list[str], **kw) -> subprocess.Popen:
    """A child that gets SIGKILL when this process dies, however it dies (Linux)."""

    def die_with_parent() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return subprocess.Popen(cmd, preexec_fn=die_with_parent, **kw)


def probe_cpus(rounds: int) -> dict:
    cpus = _cpus()
    step = _stages_step(_stages())
    across, control, blocks = [], [], []
    for r in range(rounds):
        a, b = cpus if r % 2 == 0 else cpus[::-1]
        got = []
        for cpu in (a, b, a):
            with on_cpu(cpu):
                got.append(block(step))
        blocks.append([[cpu, round(t * 1e3, 2)] for cpu, t in zip((a, b, a), got, strict=True)])
        ratio = got[1] / math.sqrt(got[0] * got[2])
        across.append(ratio if b == cpus[1] else 1 / ratio)
        control.append(got[2] / got[0])
    ctl = summary("the first CPU's second block over its first, as far apart", control)
    keep = ("probe", "median", "ci95", "range", "rounds_more_than_10pct_apart")
    return summary(
        f"CPU {cpus[1]} over CPU {cpus[0]}, per-step CPU time",
        across,
        control={k: ctl[k] for k in keep},
        block_ms=blocks,  # per round: [cpu, median ms per step] in the order run
    )


# `waker`: sleeps 5 ms, then copies 256 KB (evicting about that much of the step's cache)
WAKER = """
import time
buf, zeros = bytearray(256 * 1024), bytes(256 * 1024)
while True:
    time.sleep(0.005)
    buf[:] = zeros
"""


def _neighbour(kind: str) -> subprocess.Popen:
    if kind in ("busy", "waker"):
        return _child([sys.executable, "-c", "while True: pass" if kind == "busy" else WAKER])
    proc = _child([sys.executable, __file__, "_target-loop"], stdout=subprocess.PIPE, text=True)
    if proc.stdout is None or proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError("the target-loop neighbour did not start (its error is above)")
    return proc


def _target_loop() -> None:
    torch.set_num_threads(1)
    st = _stages()
    target = st.run.target
    print("ready", flush=True)
    while True:
        for b in st.data:
            target(b.input_ids, b.positions, b.doc_ids)


def probe_beside(kind: str, rounds: int) -> dict:
    cpus = _cpus()
    nb = _neighbour(kind)
    try:
        os.kill(nb.pid, signal.SIGSTOP)
        step = _stages_step(_stages())
        ratios = []
        for r in range(rounds):
            mine, other = cpus if (r // 2) % 2 == 0 else cpus[::-1]
            os.sched_setaffinity(nb.pid, {mine if kind == "waker" else other})
            got = {}
            for state in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
                os.kill(nb.pid, signal.SIGCONT if state == "busy" else signal.SIGSTOP)
                with on_cpu(mine):
                    got[state] = block(step)
            os.kill(nb.pid, signal.SIGSTOP)
            ratios.append(got["busy"] / got["idle"])  # > 1: slower beside the neighbour
    finally:
        nb.kill()
        nb.wait()
    where = "on the same CPU" if kind == "waker" else "on the other CPU"
    return summary(f"beside a {kind} neighbour {where} over without it", ratios)


def _block_server() -> None:
    """A `processes` child: one block per line read, its median printed."""
    torch.set_num_threads(1)
    step = _stages_step(_stages())
    print("ready", flush=True)
    for _ in sys.stdin:
        print(block(step), flush=True)


def _read(kid: subprocess.Popen, i: int) -> str:
    line = kid.stdout.readline() if kid.stdout else ""
    if not line:
        raise RuntimeError(f"process {i} ended (exit code {kid.poll()}; its error is above)")
    return line.strip()


def probe_processes(k: int, rounds: int) -> dict:
    cpus = _cpus()
    cmd = [sys.executable, __file__, "_block-server"]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    kids = [_child(cmd, **pipes) for _ in range(k)]
    try:
        for i, kid in enumerate(kids):
            if _read(kid, i) != "ready":
                raise RuntimeError(f"process {i} did not start")
        per = [[0.0] * rounds for _ in kids]
        for r in range(rounds):
            order = list(range(k))
            random.shuffle(order)
            for i in order:
                os.sched_setaffinity(kids[i].pid, {cpus[r % len(cpus)]})
                kids[i].stdin.write("go\n")  # type: ignore[union-attr]
                kids[i].stdin.flush()  # type: ignore[union-attr]
                per[i][r] = float(_read(kids[i], i))
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
    # each process over the round's median over processes: the host's drift cancels
    rel = [[p[r] / statistics.median(q[r] for q in per) for r in range(rounds)] for p in per]
    procs = [round(statistics.median(x), 3) for x in rel]
    worst = max(range(k), key=lambda i: abs(procs[i] - 1))
    name = f"process {worst} (farthest from 1) over the round's median"
    return summary(name, rel[worst], processes=procs)


def _input_variants(batches: int) -> tuple[Callable, dict[str, Callable[..., Any]]]:
    """(train one micro-batch, {variant: i -> that variant's i-th micro-batch})."""
    from dflash.data.packing import PackedBatch
    from dflash.distributed.p2p import pack_meta, unpack_meta, wire_of
    from dflash.distributed.telemetry import COUNTERS
    from dflash.run import build_run
    from dflash.step import Accumulator, FeatureBatch, train_step

    cfg = _config(["--targets", "1", "--drafters", "1"])
    run = build_run(cfg, "single")
    data = [next(run.stream) for _ in range(batches)]
    feats = [run.target(b.input_ids, b.positions, b.doc_ids) for b in data]
    wire = wire_of(cfg, run)
    ring = [wire.empty("cpu") for _ in range(3)]  # what p2p.Receiver cycles through
    acc = Accumulator(cfg.block_size, run.device)
    n_fresh = batches - 33

    def message(i: int, pack_on: int | None = None):
        """Fresh batch i through the ring: packed (on CPU `pack_on`, where gloo's thread
        would write it), then read on this thread's CPU, as a drafter's main thread does."""
        g = 33 + i % n_fresh
        meta, f = wire.split(ring[i % len(ring)])
        with on_cpu(pack_on):
            pack_meta(data[g], g, [0] * len(COUNTERS), meta)
            f.copy_(feats[g])
        header, ids, mask, docs, pos = unpack_meta(meta, cfg.rows, cfg.seq_len)
        return FeatureBatch(g, PackedBatch(ids, mask, docs, pos, 0, 0), f, header[1])

    def fixed(j: int, index: int):
        return FeatureBatch(index, data[j], feats[j], data[j].n_tokens)

    variants: dict[str, Callable[..., Any]] = {
        "capacity": lambda i: fixed(3 + i % 30, 0),  # Stages: batches 3-32, each as batch 0
        "own_index": lambda i: fixed(3 + i % 30, 3 + i % 30),
        "fresh": lambda i: fixed(33 + i % n_fresh, 33 + i % n_fresh),
        "through_wire": message,
    }
    return lambda fb: train_step(run, 0, [fb], n_micro=1, acc=acc), variants


def _nth(variant: Callable[[int], Any], start: int, i: int) -> Any:
    return variant(start + i)  # each block takes micro-batches where the last one stopped


def probe_inputs(rounds: int, batches: int) -> dict:
    cpus = _cpus()
    train, variants = _input_variants(batches)
    if len(cpus) > 1:  # the message as gloo's thread on the other CPU would leave it
        variants["wire_other_cpu"] = variants["through_wire"]  # given pack_on below
    made = dict.fromkeys(variants, 0)
    per: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants)
        random.shuffle(order)
        mine, other = cpus[r % len(cpus)], cpus[(r + 1) % len(cpus)]
        for name in order:
            make = variants[name]
            if name == "wire_other_cpu":
                make = partial(make, pack_on=other)
            with on_cpu(mine):
                per[name].append(block(train, prepare=partial(_nth, make, made[name])))
            made[name] += WARM + BLOCK

    def over(a: str, b: str) -> list[float]:  # round by round
        return [x / y for x, y in zip(per[a], per[b], strict=True)]

    keep = ("median", "ci95")
    others = {
        name: {k: summary(name, over(name, "capacity"))[k] for k in keep}
        for name in ("own_index", "fresh")
    }
    if "wire_other_cpu" in per:
        s = summary("", over("wire_other_cpu", "through_wire"))
        others["wire_other_cpu_over_own_cpu"] = {k: s[k] for k in (*keep, "range")}
    wire = summary("through the wire over the capacity's batches", over("through_wire", "capacity"))
    return {**wire, "others": others}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("cpus").add_argument("--rounds", type=int, default=30)
    inputs = sub.add_parser("inputs")
    inputs.add_argument("--rounds", type=int, default=40)
    inputs.add_argument("--batches", type=int, default=400, help="batches built (>= 40)")
    beside = sub.add_parser("beside")
    beside.add_argument("neighbour", choices=["target", "busy", "waker"])
    beside.add_argument("--rounds", type=int, default=60)
    procs = sub.add_parser("processes")
    procs.add_argument("k", type=int)
    procs.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: give at least 2 (6 or more for the interval)")
    if args.mode in ("cpus", "beside") and len(_cpus()) < 2:
        parser.error(f"{args.mode}: needs 2 CPUs and may use 1: run it under taskset -c 0,1")
    if args.mode == "processes" and args.k < 2:
        parser.error(f"processes {args.k}: compare at least 2 processes")
    if args.mode == "inputs" and args.batches < 40:
        parser.error(f"--batches {args.batches}: give at least 40 (33 are the fixed ones)")
    # a plain `kill` ends this process through its `finally` blocks (children stopped)
    signal.signal(signal.SIGTERM, exit_on_signal)
    torch.set_num_threads(1)
    if args.mode == "cpus":
        result = probe_cpus(args.rounds)
    elif args.mode == "beside":
        result = probe_beside(args.neighbour, args.rounds)
    elif args.mode == "processes":
        result = probe_processes(args.k, args.rounds)
    else:
        result = probe_inputs(args.rounds, args.batches)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_target-loop"]:
        _target_loop()
    elif sys.argv[1:2] == ["_block-server"]:
        _block_server()
    else:
        sys.exit(main())
