"""Where a CPU pipeline's threads spend their time: one T + D run (default 1 + 1), beside
`--busy N` other tenants or not (`--busy-nice`, `--busy-nice-scope`, `--busy-policy`: as
in bench/pipeline_efficiency.py), each rank's threads read from /proc over the run's
steady part (from its first logging step to its last): per thread, the CPU-seconds it
ran per second and the seconds it waited, runnable, for a core (schedstat). A rank's
main thread computes; the others are the communication library's (gloo's event loops
and workers). The last line is JSON: the drafters' tokens/s and those per CPU-second,
and per role the main thread's and the other threads' figures.

    .venv/bin/python bench/comm_threads.py --busy 1 --busy-nice 19 -- --max-steps 1000 \
        --log-every 10

`--perf` (needs the perf tool and the right to trace the host: root, or
kernel.perf_event_paranoid <= -1) also records the host's context switches and
epoll_wait calls for 4 s of the steady part and reports, per role, how many epoll_wait
calls its threads made and how many of them came while its main thread was preempted
(runnable, not running): gloo's event loop spinning on a pair whose lock the preempted
main thread holds (docs/bench.md, "The communication threads beside a tenant").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_efficiency import (  # noqa: E402
    add_tenant_arguments,
    start_tenants,
    stop_tenants,
    tenant_options,
    tenant_settings,
)

from dflash.bench.capacity import interval_means  # noqa: E402
from dflash.distributed.launch import torchrun_command, worker_env, worker_pids  # noqa: E402


def thread_times(pid: int) -> dict[int, tuple[float, float]]:
    """{tid: (seconds run, seconds runnable but waiting)} of a process's live threads."""
    times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            run_ns, wait_ns, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:  # the thread ended between listdir and read
            continue
        times[int(tid)] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return times


def epoll_while_preempted(trace: Path, pids: dict[str, int]) -> dict:
    """Per role (one rank each, {role: pid}): epoll_wait calls of its threads, and those
    made while its main thread (tid = pid) was preempted, from `perf script` of
    sched_switch + sys_enter_epoll_wait events."""
    script = ["perf", "script", "-i", str(trace), "-F", "pid,event,trace"]
    lines = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    role_of = {pid: role for role, pid in pids.items()}
    preempted = dict.fromkeys(pids.values(), False)
    calls: Counter[str] = Counter()
    spun: Counter[str] = Counter()
    switch = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)")
    for line in lines.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        if "sched_switch" in line and (m := switch.search(line)):
            prev, state, nxt = int(m[1]), m[2], int(m[3])
            if prev in preempted:
                preempted[prev] = state.startswith("R")
            if nxt in preempted:
                preempted[nxt] = False
        elif "epoll_wait" in line and (role := role_of.get(int(fields[0]))):
            calls[role] += 1
            spun[role] += preempted[pids[role]]
    return {r: {"epoll_wait": calls[r], "while_main_preempted": spun[r]} for r in pids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=1)
    parser.add_argument("--drafters", type=int, default=1)
    add_tenant_arguments(parser)  # as bench/pipeline_efficiency.py's
    parser.add_argument("--perf", action="store_true", help="also trace epoll_wait (perf)")
    parser.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = parser.parse_args(argv)
    tenant = tenant_options(parser, args)
    if args.perf and shutil.which("perf") is None:
        parser.error("--perf needs the perf tool on PATH (the linux-perf or linux-tools package)")
    from dflash.train_cli import config_of

    base = ["--wandb", "off", "--targets", str(args.targets), "--drafters", str(args.drafters)]
    with tempfile.TemporaryDirectory(prefix="dflash-threads-") as tmp:
        try:
            run_dir = str(Path(tmp) / "run")
            cfg = config_of([*base, "--out", run_dir, *args.flags])
        except ValueError as e:  # a bad flag after --: name it, no traceback
            parser.error(str(e))
        tenants = start_tenants(*tenant)
        try:
            if tenants:
                time.sleep(3)
            setting = {"tenants": args.busy, **tenant_settings(args)} if tenants else None
            return _run(cfg, args.perf, Path(tmp) / "sched.data", setting)
        finally:
            stop_tenants(tenants)


def _run(cfg, perf: bool, trace: Path, tenants: dict | None = None) -> int:
    cmd = torchrun_command(cfg, cfg.targets + cfg.drafters, module="dflash.distributed.rank_cli")
    job = subprocess.Popen(cmd, env=worker_env(), stdout=subprocess.DEVNULL)
    metrics = Path(cfg.out) / "metrics.jsonl"
    pids: dict[int, int] = {}
    samples = []  # (time, metrics lines, {rank: thread_times}) from the first logging step
    tracer = None
    while job.poll() is None:
        time.sleep(0.2)
        logged = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        if logged < 1:
            continue
        pids = pids or worker_pids(job.pid)
        try:
            threads = {r: thread_times(p) for r, p in pids.items()}
        except OSError:  # a rank exited: the run is ending
            break
        samples.append((time.perf_counter(), logged, threads))
        if perf and tracer is None:
            events = ["-e", "sched:sched_switch", "-e", "syscalls:sys_enter_epoll_wait"]
            tracer = subprocess.Popen(
                ["perf", "record", "-q", "-a", *events, "-o", str(trace), "--", "sleep", "4"],
                stdout=subprocess.DEVNULL,
            )
    traced = tracer.wait() == 0 if tracer is not None else None
    logged_in_all = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    # Up to the last logging step: after it the ranks save, and tear their groups (and
    # the communication threads) down.
    steady = [(t, ranks) for t, logged, ranks in samples if logged < logged_in_all]
    if job.wait() != 0:
        print(f"the pipeline failed (exit {job.returncode}): see its errors above", file=sys.stderr)
        return 1
    if len(steady) < 2 or steady[-1][0] - steady[0][0] < 1:
        print("the run ended before a steady second: raise --max-steps", file=sys.stderr)
        return 1
    first, last = steady[0], steady[-1]
    tok_s = interval_means(Path(cfg.out))["drafter_tok_per_s"]
    span = last[0] - first[0]
    drafters = range(cfg.drafters)  # global ranks [0, D) are drafters (roles.py)
    result: dict = {"drafter_tok_per_s": round(tok_s), "seconds": round(span, 1)}
    result.update(tenants or {})
    cpu_by_role: dict[str, float] = {}
    for role, ranks in (("drafter", drafters), ("target", range(cfg.drafters, len(pids)))):
        rows = {"main_cpu": 0.0, "main_waiting": 0.0, "other_cpu": 0.0, "other_waiting": 0.0}
        for r in ranks:
            for tid, (run1, wait1) in last[1][r].items():
                run0, wait0 = first[1][r].get(tid, (0.0, 0.0))
                kind = "main" if tid == pids[r] else "other"
                rows[f"{kind}_cpu"] += (run1 - run0) / span / len(ranks)
                rows[f"{kind}_waiting"] += (wait1 - wait0) / span / len(ranks)
        cpu_by_role[role] = rows["main_cpu"] + rows["other_cpu"]
        result[role] = {k: round(v, 3) for k, v in rows.items()}
        print(
            f"{role} (mean of {len(ranks)}), per second: main thread ran {rows['main_cpu']:.3f} s, "
            f"waited {rows['main_waiting']:.3f} s; other threads ran {rows['other_cpu']:.3f} s, "
            f"waited {rows['other_waiting']:.3f} s"
        )
    result["tok_per_drafter_cpu_s"] = round(tok_s / cfg.drafters / cpu_by_role["drafter"])
    if traced is False:
        print(
            "perf record failed: tracing the host needs root or "
            "kernel.perf_event_paranoid <= -1; run without --perf for the thread figures",
            file=sys.stderr,
        )
        return 1
    if traced:
        roles = {"drafter": 0, "target": cfg.drafters}  # the first rank of each role
        result["perf"] = epoll_while_preempted(trace, {k: pids[r] for k, r in roles.items()})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
