"""How fast the same drafter step runs, and what changes it: the probes behind the quiet
1 + 1 efficiency (docs/bench.md, "Where the quiet 6% is not").

Each mode times the trainer's own step (dflash.step.train_step, the capacity's stage
alone: dflash/bench/capacity.py) in short blocks, as the median thread CPU time per step,
so that a block is not charged for time its thread spent off the CPU. Conditions
alternate block by block (the host's speed drifts within seconds), and each prints the
per-round ratio's median with its distribution-free 95% interval as its last line (JSON).

    .venv/bin/python bench/step_speed.py cpus --rounds 30       # CPU 1 over CPU 0, same step
    .venv/bin/python bench/step_speed.py beside target --rounds 60  # other CPU busy / idle
    .venv/bin/python bench/step_speed.py processes 6 --rounds 40   # each process / the round's median
    .venv/bin/python bench/step_speed.py inputs --rounds 40        # the pipeline's inputs / the capacity's

- `cpus`: one process, pinned to CPU 0 then CPU 1 (the order alternating by round).
- `beside NEIGHBOUR`: pinned to one CPU while the next one is idle or runs a neighbour
  (`target`: the target's forward in a loop, what the other rank runs in a 1 + 1
  pipeline; `busy`: a pure-Python loop), switched by SIGSTOP/SIGCONT; the two CPUs swap
  every two rounds. `waker` runs on the step's own CPU instead: it wakes every 5 ms and
  touches 256 KB, so the step is preempted about as often as a pipeline drafter's is.
- `processes K`: K processes built alike, a block each per round in random order, all on
  the same CPU in a round: does where a process's memory landed change its speed?
- `inputs`: the micro-batches the capacity times (its 30 batches, all with batch index 0)
  against what a pipeline drafter trains on: each batch's own index (its own anchors),
  fresh batches from the stream, and those read through a message buffer as
  dflash/distributed/p2p.py receives them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from dflash.bench.stats import median_interval

BLOCK = 20  # steps per block: ~0.3-0.5 s of the tiny preset on this class of host


def _config(extra: list[str] | None = None):
    from dflash.train_cli import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tempfile.mkdtemp(prefix="dflash-step-speed-")
    return config_from_args(parser.parse_args(["--wandb", "off", "--out", out, *(extra or [])]))


def _stages(batches: int = BLOCK):
    from dflash.bench.capacity import Stages

    return Stages(_config(), batches=batches)


def block(step: Callable[[int], None], n: int = BLOCK, warm: int = 2) -> float:
    """Median thread CPU seconds of `step(i)` over n calls, after `warm` untimed ones."""
    for i in range(warm):
        step(i)
    times = []
    for i in range(n):
        t = time.thread_time()
        step(warm + i)
        times.append(time.thread_time() - t)
    return statistics.median(times)


def _stages_step(st) -> Callable[[int], None]:
    data = st.data[st.warmup :]
    return lambda i: st._train_one(data[i % len(data)])


def summary(name: str, ratios: list[float], **extra) -> dict:
    ci = median_interval(ratios)
    return {
        "probe": name,
        "rounds": len(ratios),
        "ratios": [round(r, 3) for r in ratios],
        "median": round(statistics.median(ratios), 3),
        "ci95": [round(x, 3) for x in ci] if ci else None,
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
        **extra,
    }


def probe_cpus(rounds: int) -> dict:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    step = _stages_step(_stages())
    ratios = []
    for r in range(rounds):
        got = {}
        for cpu in cpus if r % 2 == 0 else cpus[::-1]:
            os.sched_setaffinity(0, {cpu})
            got[cpu] = block(step)
        ratios.append(got[cpus[1]] / got[cpus[0]])  # > 1: the second CPU was slower
    apart = sum(abs(r - 1) > 0.1 for r in ratios)
    return summary(f"CPU {cpus[1]} over CPU {cpus[0]}, per-step CPU time", ratios,
                   rounds_more_than_10pct_apart=apart)  # fmt: skip


# `waker`: on the step's own CPU, wakes every 5 ms and touches 256 KB, then sleeps: about
# the preemptions a pipeline drafter's main thread takes (98 a second, docs/bench.md)
WAKER = """
import time
buf = bytearray(256 * 1024)
while True:
    time.sleep(0.005)
    for i in range(0, len(buf), 4096):
        buf[i] = (buf[i] + 1) & 255
"""


def _neighbour(kind: str) -> subprocess.Popen:
    if kind in ("busy", "waker"):
        code = "while True: pass" if kind == "busy" else WAKER
        return subprocess.Popen([sys.executable, "-c", code])
    proc = subprocess.Popen(
        [sys.executable, __file__, "_target-loop"], stdout=subprocess.PIPE, text=True
    )
    if proc.stdout is None or proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the target-loop neighbour did not start")
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
    cpus = sorted(os.sched_getaffinity(0))[:2]
    nb = _neighbour(kind)
    try:
        os.kill(nb.pid, signal.SIGSTOP)
        step = _stages_step(_stages())
        ratios = []
        for r in range(rounds):
            mine, other = cpus if (r // 2) % 2 == 0 else cpus[::-1]
            os.sched_setaffinity(0, {mine})
            os.sched_setaffinity(nb.pid, {mine if kind == "waker" else other})
            got = {}
            for state in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
                os.kill(nb.pid, signal.SIGCONT if state == "busy" else signal.SIGSTOP)
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


def probe_processes(k: int, rounds: int) -> dict:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    cmd = [sys.executable, __file__, "_block-server"]
    kids = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(k)
    ]
    try:
        for kid in kids:
            assert kid.stdout is not None and kid.stdout.readline().strip() == "ready"
        per = [[0.0] * rounds for _ in kids]
        for r in range(rounds):
            order = list(range(k))
            random.shuffle(order)
            for i in order:
                os.sched_setaffinity(kids[i].pid, {cpus[r % len(cpus)]})
                kids[i].stdin.write("go\n")  # type: ignore[union-attr]
                kids[i].stdin.flush()  # type: ignore[union-attr]
                per[i][r] = float(kids[i].stdout.readline())  # type: ignore[union-attr]
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
    # each process against the round's median over processes: the host's drift cancels
    rel = [
        [per[i][r] / statistics.median(p[r] for p in per) for r in range(rounds)] for i in range(k)
    ]
    procs = [summary(f"process {i}", rel[i])["median"] for i in range(k)]
    worst = max(range(k), key=lambda i: abs(procs[i] - 1))
    return summary(f"process {worst} (farthest from 1) over the round's median", rel[worst],
                   processes=procs)  # fmt: skip


def probe_inputs(rounds: int, batches: int = 400) -> dict:
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
    ring = [wire.empty("cpu") for _ in range(3)]
    acc = Accumulator(cfg.block_size, run.device)

    def capacity(i: int):  # Stages: batches 3-32, every one as batch 0
        j = 3 + i % 30
        return FeatureBatch(0, data[j], feats[j], data[j].n_tokens)

    def own_index(i: int):
        j = 3 + i % 30
        return FeatureBatch(j, data[j], feats[j], data[j].n_tokens)

    def fresh(i: int):
        g = 33 + i % (batches - 33)
        return FeatureBatch(g, data[g], feats[g], data[g].n_tokens)

    def through_wire(i: int):
        g = 33 + i % (batches - 33)
        meta, f = wire.split(ring[i % len(ring)])
        pack_meta(data[g], g, [0] * len(COUNTERS), meta)
        f.copy_(feats[g])
        header, ids, mask, docs, pos = unpack_meta(meta, cfg.rows, cfg.seq_len)
        return FeatureBatch(g, PackedBatch(ids, mask, docs, pos, 0, 0), f, header[1])

    variants = {"capacity": capacity, "own_index": own_index, "fresh": fresh,
                "through_wire": through_wire}  # fmt: skip
    made = dict.fromkeys(variants, 0)
    per: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:

            def step(i: int, name=name) -> None:
                train_step(run, 0, [variants[name](made[name] + i)], n_micro=1, acc=acc)

            per[name].append(block(step))
            made[name] += BLOCK + 2
    over = {  # each variant over the capacity's batches, round by round
        name: summary(name, [a / b for a, b in zip(per[name], per["capacity"], strict=True)])
        for name in variants if name != "capacity"
    }  # fmt: skip
    got = over.pop("through_wire")
    return {**got, "probe": "through the wire over the capacity's batches",
            "others": {k: {"median": v["median"], "ci95": v["ci95"]} for k, v in over.items()}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for name in ("cpus", "inputs"):
        sub.add_parser(name).add_argument("--rounds", type=int, default=30)
    beside = sub.add_parser("beside")
    beside.add_argument("neighbour", choices=["target", "busy", "waker"])
    beside.add_argument("--rounds", type=int, default=60)
    procs = sub.add_parser("processes")
    procs.add_argument("k", type=int)
    procs.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: a ratio needs at least 2 rounds")
    if args.mode != "inputs" and len(os.sched_getaffinity(0)) < 2:
        parser.error(f"{args.mode}: needs 2 CPUs; this process may use 1")
    if args.mode == "processes" and args.k < 2:
        parser.error(f"processes {args.k}: compare at least 2 processes")
    torch.set_num_threads(1)
    if args.mode == "cpus":
        result = probe_cpus(args.rounds)
    elif args.mode == "beside":
        result = probe_beside(args.neighbour, args.rounds)
    elif args.mode == "processes":
        result = probe_processes(args.k, args.rounds)
    else:
        result = probe_inputs(args.rounds)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_target-loop"]:
        _target_loop()
    elif sys.argv[1:2] == ["_block-server"]:
        _block_server()
    else:
        sys.exit(main())
