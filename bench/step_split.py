"""Where a 1 + 1 CPU pipeline's drafter step goes, against the stage alone timed in the
same pauses (docs/bench.md, "Where the quiet loss goes").

One 1 + 1 run (`dflash train` flags after `--`), its drafter rank traced per step: the
thread CPU time of the step's own work, the wall time spent getting its micro-batches off
the wire (posting the next receive, waiting, reading the message's views), the step's
whole wall time and the loop's period (from one step's start to the next: the logging
steps' reductions and metrics lines included). Every `--period` steps the drafter
pauses: it sleeps half a second, so that the target fills its in-flight batches and
blocks, and then this process times the capacity's drafter stage alone
(dflash/bench/capacity.py's `Stages._timed`, as the capacity measures it: a block of
`--batches` steps, mean CPU and wall time per step) while the drafter waits. Each round
sets the means over the stretch before the pause (its first steps after the last pause
left out) against that block, each part in units of the stage alone's wall time per
step:

- `step`: the step's own thread CPU time, over the stage alone's CPU time (1: the step
  itself runs as fast as alone; this process has one thread, so its CPU time is the
  stage's);
- `receive`: wall time getting the batch (`receive_cpu`: the thread CPU time of it, the
  rest is waiting for the batch or off the CPU);
- `post`: wall time posting irecvs (gloo takes the pair's lock and writes to its
  socket). On CPU the refills are posted by the receiver's helper thread, beside the
  step (dflash/distributed/p2p.py::Receiver): not a part of `period`;
- `off_cpu`: the rest of the step's wall time: its thread off the CPU outside the
  receive (preempted);
- `between`: the loop's time between steps (logging);
- `period`: the loop's period; its inverse is the round's efficiency, pipeline tok/s
  over the stage alone's, as bench/pipeline_efficiency.py defines it.

`period` = `step` x (alone's CPU over its wall, about 1) + `receive` + `off_cpu` +
`between`. The last line is JSON: each figure's median over the rounds with its
distribution-free 95% interval (bench/step_speed.py::summary).

    .venv/bin/python bench/step_split.py --rounds 40 -- --log-every 10
    .venv/bin/python bench/step_split.py --rounds 40 -- --log-every 10 --pin-cpus
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_speed import _child, summary  # noqa: E402

ADDR = "DFLASH_STEP_SPLIT_ADDR"  # the Unix socket that the drafter rank asks for a block on
PERIOD = "DFLASH_STEP_SPLIT_PERIOD"  # --period, for the ranks
SKIP = 10  # steps after each pause left out of the stretch: the queue refills after it
NAP = 0.5  # seconds: the target fills its in-flight batches and blocks on them
# a stretch's means, sent per pause
PIPELINE = ("step_cpu", "receive_cpu", "receive", "post", "wall", "period")
PARTS = ("step", "receive", "receive_cpu", "post", "off_cpu", "between", "period")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="pauses, one ratio each")
    parser.add_argument("--period", type=int, default=150, help="drafter steps per round")
    parser.add_argument("--batches", type=int, default=25, help="steps per block alone")
    parser.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batches < 1 or args.period <= SKIP + 1:
        parser.error(
            f"--rounds {args.rounds} --batches {args.batches} --period {args.period}: give "
            f"rounds and batches >= 1 and a period above {SKIP + 1} steps"
        )
    for flag in ("--max-steps", "--targets", "--drafters", "--out"):
        if any(f == flag or f.startswith(flag + "=") for f in args.flags):
            parser.error(f"{flag} is set by this bench (1 + 1, --rounds x --period steps)")
    return _run(args)


def _config(args: argparse.Namespace, out: str):
    from dflash.train_cli import config_of

    steps = args.rounds * args.period + 1
    fixed = ["--wandb", "off", "--targets", "1", "--drafters", "1", "--out", out]
    return config_of([*fixed, "--max-steps", str(steps), *args.flags])


def _run(args: argparse.Namespace) -> int:
    import torch

    from dflash.bench.capacity import Stages, on_cpu, rank_cpus
    from dflash.distributed.launch import config_argv, worker_env

    torch.set_num_threads(1)  # one intra-op thread, as each rank has (launch.worker_env)
    work = Path(tempfile.mkdtemp(prefix="dflash-step-split-"))
    cfg = _config(args, str(work / "run"))
    stages = Stages(cfg, batches=args.batches)
    cpus = rank_cpus(cfg)  # pinned: the stage alone on the drafter's CPU, as capacity does
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(work / "sock"))
    server.listen(1)
    server.settimeout(1.0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["2", str(Path(__file__).resolve()), *config_argv(cfg)]
    env = {**worker_env(), ADDR: str(work / "sock"), PERIOD: str(args.period)}
    log = open(work / "ranks.log", "w")  # noqa: SIM115  the ranks' output, read on a failure
    job = _child(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    rows: list[dict] = []
    conn = None
    try:
        while conn is None:  # the drafter connects at its first pause
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if job.poll() is not None:
                    why = f"the pipeline ended before its first pause:\n{_tail(work)}"
                    raise SystemExit(why) from None
        conn.settimeout(600)  # a drafter that stops asking for 10 minutes: stop waiting
        lines = conn.makefile("rw")
        for line in lines:
            pipe = json.loads(line)
            with on_cpu(cpus["drafter"] if cpus else None):
                alone_cpu, alone_wall = _alone(stages)
            lines.write("go\n")
            lines.flush()
            row = _ratios(pipe, alone_cpu, alone_wall)
            rows.append(row)
            print(json.dumps(row), flush=True)
        rc = job.wait()
        if rc != 0:
            raise SystemExit(f"the pipeline failed (exit {rc}):\n{_tail(work)}")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        server.close()
        log.close()
        shutil.rmtree(work, ignore_errors=True)  # the run's checkpoints and the socket
    out = {
        "rounds": len(rows),
        "pinned": cfg.pin_cpus,
        "load_average": round(os.getloadavg()[0], 2),
    }
    for key in PARTS:
        got = summary(key, [r[key] for r in rows])
        out[key] = {k: got[k] for k in ("median", "ci95", "range")}
    eff = summary("efficiency", [1 / r["period"] for r in rows])
    out["efficiency"] = {k: eff[k] for k in ("median", "ci95", "range")}
    print(json.dumps(out))
    return 0


def _tail(work: Path) -> str:
    """The end of the ranks' output, for an error message."""
    return (work / "ranks.log").read_text()[-3000:]


def _alone(stages) -> tuple[float, float]:
    """Mean CPU and wall seconds per step of the capacity's drafter stage, timed as
    `capacity.measure` times it (`Stages._timed`: its warm-up batches untimed first)."""
    per_wall, per_cpu = stages._timed(stages._train_one)  # tokens per second
    steps = len(stages.data) - stages.warmup
    return stages.n_tokens / per_cpu / steps, stages.n_tokens / per_wall / steps


def _ratios(pipe: dict, alone_cpu: float, alone_wall: float) -> dict:
    """One round: the pipeline's mean step (seconds) split against the stage alone's."""
    parts = {
        "step": pipe["step_cpu"] / alone_cpu,
        "receive": pipe["receive"] / alone_wall,
        "receive_cpu": pipe["receive_cpu"] / alone_wall,
        "post": pipe["post"] / alone_wall,
        "off_cpu": (pipe["wall"] - pipe["step_cpu"] - pipe["receive"]) / alone_wall,
        "between": (pipe["period"] - pipe["wall"]) / alone_wall,
        "period": pipe["period"] / alone_wall,
    }
    return {
        "step_at": pipe["step_at"],
        "pipeline_ms": {k: round(pipe[k] * 1e3, 3) for k in PIPELINE},
        "alone_ms": {"cpu": round(alone_cpu * 1e3, 3), "wall": round(alone_wall * 1e3, 3)},
        **{k: round(v, 4) for k, v in parts.items()},
    }


def _rank(addr: str) -> int:
    """One rank of the traced run: the drafter's step and receive timed, a pause every
    --period steps. Only the drafter rank traces; the target runs as it always does."""
    import torch

    import dflash.distributed.drafter_rank as dr
    from dflash.distributed import rank_cli

    period = int(os.environ[PERIOD])
    # this step's: inside the receiver's get, and posting (on CPU, by its helper thread)
    got = {"cpu": 0.0, "wall": 0.0, "post": 0.0}

    class TracedReceiver(dr.Receiver):
        def _post(self):
            w = time.perf_counter()
            try:
                super()._post()
            finally:
                got["post"] += time.perf_counter() - w

        def get(self):
            c, w = time.thread_time(), time.perf_counter()
            try:
                return super().get()
            finally:
                got["cpu"] += time.thread_time() - c
                got["wall"] += time.perf_counter() - w

    stretch: list[tuple[float, ...]] = []  # PIPELINE's first five, per step
    periods: list[float] = []  # start to start, of the stretch's steps but its last
    link: list = []
    started = [0.0]
    plain = dr.train_step

    def traced(run, step, batches=None, **kw):
        got["cpu"] = got["wall"] = got["post"] = 0.0
        c, w = time.thread_time(), time.perf_counter()
        at = step % period
        if at > SKIP:  # the previous step's period: its logging, if any, included
            periods.append(w - started[0])
        started[0] = w
        res = plain(run, step, batches, **kw)
        # The returned loss holds the step's autograd graph, which the caller would free
        # after this returns (outside `wall`); the stage alone frees it within its step.
        res = dataclasses.replace(res, loss=res.loss.detach())
        wall, cpu = time.perf_counter() - w, time.thread_time() - c
        if at >= SKIP:
            # the receive's thread CPU is inside `cpu`, its wall time inside `wall`
            stretch.append((cpu - got["cpu"], got["cpu"], got["wall"], got["post"], wall))
        if at == period - 1:
            time.sleep(NAP)
            if not link:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(addr)
                link.append(sock.makefile("rw"))
            # means: the pipeline's tok/s is tokens over the stretch's whole time
            mean = [statistics.fmean(x) for x in zip(*stretch[:-1], strict=True)]
            pipe = dict(zip(PIPELINE, [*mean, statistics.fmean(periods)], strict=True))
            pipe["step_at"] = step
            link[0].write(json.dumps(pipe) + "\n")
            link[0].flush()
            link[0].readline()  # the block alone is done
            stretch.clear()
            periods.clear()
        return res

    # run_drafter looks both names up in its module when it runs: trace them there
    vars(dr).update(Receiver=TracedReceiver, train_step=traced)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return rank_cli.main(sys.argv[1:])


if __name__ == "__main__":
    if os.environ.get(ADDR):
        sys.exit(_rank(os.environ[ADDR]))
    sys.exit(main())
