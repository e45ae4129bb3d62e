"""Pipeline efficiency of a T-target + D-drafter run (dflash/bench/capacity.py), as JSON:
each repeat is a pipeline run between two measurements of its stages alone (`--batches`
batches each); the last line is the median efficiency and of its factors: the drafters'
compute fraction (the rest waits on targets), the share of a core they got while computing,
and how far their CPU-seconds go against the stage alone (capacity.measure). Each repeat
also reports `steal`: the CPU-seconds per second the hypervisor took from this machine
while it ran (/proc/stat); above a few hundredths, the repeat measured the host as much
as the pipeline.

    .venv/bin/python bench/pipeline_efficiency.py --targets 1 --drafters 1 --repeats 5 \
        --batches 40 -- --max-steps 30 --log-every 5

`--busy N` starts N other tenants first (each a pure-Python loop in its own process, 5 s
before the first repeat, killed at the end) and reports the CPU-seconds per second they
got while each pipeline ran (`tenant_cpu`): what a change such as `--pin-cpus` takes
from them is then measured, not assumed. With tenants, each repeat also reports
`cpu_bound`, the highest efficiency the CPUs they leave allow (capacity.cpu_bound), and
`efficiency_of_bound`, how much of it the pipeline reached. `--busy-nice N` starts them
at niceness N, default 0: the same priority as the pipeline. Each tenant runs in a session
of its own, and where the kernel groups sessions (autogroup) the niceness is set on that
session too: `nice -n 19` alone does not lower a job against torchrun's ranks there
(start_tenants says why); `--busy-nice-scope process` measures what it alone gives.
`--busy-policy idle` starts them under SCHED_IDLE (`chrt --idle 0`).

`--versus FLAGS` compares two conditions side by side in one run: each repeat is then a
round of both (the flags after `--`, then with FLAGS added), the order reversed every
other round so that a drift of the host weighs on both alike. The last line then also
holds the second condition's medians (`versus_...`), the ratio of its efficiency to the
first's round by round, in how many rounds it came out ahead and the two-sided Wilcoxon
signed-rank p-value of those ratios. With 6 repeats or more, each median comes with a
distribution-free 95% interval (`..._ci95`, dflash/bench/stats.py).

`--interleave SECONDS` times the stages alone during each pipeline run instead of before
and after it: the ranks are frozen every SECONDS of running while this process times the
stages, and each stretch between two freezes is set against the stages timed seconds
before and after it (dflash/bench/interleaved.py). A repeat's figures are then medians
over its stretches; give the run time for several (on 2 cores, `--batches 30
--interleave 4 -- --max-steps 1500` made 5-7).

    .venv/bin/python bench/pipeline_efficiency.py --targets 1 --drafters 1 --repeats 8 \
        --batches 200 --versus=--pin-cpus -- --max-steps 200 --log-every 10
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dflash.bench.capacity import measure
from dflash.bench.interleaved import measure_interleaved
from dflash.bench.stats import median_interval, paired_ratio_p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, required=True)
    parser.add_argument("--drafters", type=int, required=True)
    parser.add_argument("--out", default=None, help="run directories' parent (default: temp)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batches", type=int, default=12, help="batches per stage alone")
    parser.add_argument(
        "--versus",
        metavar="FLAGS",
        help="a second condition: these `dflash train` flags added, e.g. --versus=--pin-cpus; "
        "each repeat is then a round of both, the order reversed every other round",
    )
    parser.add_argument(
        "--interleave",
        type=float,
        metavar="SECONDS",
        help="time the stages alone during each run, freezing its ranks every SECONDS of "
        "running (default: before and after it)",
    )
    add_tenant_arguments(parser)
    parser.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = parser.parse_args(argv)
    if args.interleave is not None and not args.interleave > 0:
        parser.error(f"--interleave {args.interleave:g}: give the seconds between freezes, e.g. 6")
    conditions = _conditions(parser, args)
    tenants = start_tenants(*tenant_options(parser, args))
    try:
        if tenants:
            time.sleep(5)
        return _run(args, conditions, tenants)
    finally:
        stop_tenants(tenants)


def add_tenant_arguments(parser: argparse.ArgumentParser) -> None:
    """The tenant flags, shared with bench/comm_threads.py: --busy, --busy-nice,
    --busy-nice-scope and --busy-policy."""
    parser.add_argument("--busy", type=int, default=0, help="other tenants to start first")
    parser.add_argument(
        "--busy-nice", type=int, default=0, help="the tenants' niceness, 0 (default) to 19"
    )
    parser.add_argument(
        "--busy-nice-scope",
        choices=["session", "process"],
        default="session",
        help="session (default): the niceness is set on each tenant's process and, where the "
        "kernel groups sessions (autogroup), on its session; process: on the process alone, "
        "as `nice -n N` does",
    )
    parser.add_argument(
        "--busy-policy",
        choices=["normal", "idle"],
        default="normal",
        help="normal (default): the tenants run as ordinary processes (SCHED_OTHER); idle: "
        "under SCHED_IDLE, as `chrt --idle 0 JOB` starts them",
    )


def tenant_options(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """(n, nice, session, idle) for start_tenants, once the niceness is checked: a
    one-line error that names the flag and the range, before anything starts."""
    if not 0 <= args.busy_nice <= 19:
        parser.error(f"--busy-nice {args.busy_nice} is out of range: use a niceness from 0 to 19")
    return args.busy, args.busy_nice, args.busy_nice_scope == "session", args.busy_policy == "idle"


def tenant_settings(args: argparse.Namespace) -> dict:
    """The tenant flags as a bench's JSON records them, so runs can be told apart."""
    return {
        "tenant_nice": args.busy_nice,
        "tenant_nice_scope": args.busy_nice_scope,
        "tenant_policy": args.busy_policy,
    }


AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroup_enabled() -> bool:
    """Whether the kernel schedules each session as one group (CONFIG_SCHED_AUTOGROUP on)."""
    return AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "1"


def start_tenants(
    n: int, nice: int = 0, session: bool = True, idle: bool = False
) -> list[subprocess.Popen]:
    """n pure-Python busy loops, each in a session of its own (as a job started from
    another shell, cron or a service is) at niceness `nice`, and with `idle` under
    SCHED_IDLE (sched(7): the lowest weight, and a core running only such tasks counts as
    idle where the kernel places a waking thread).

    With autogroup on, the kernel first shares the CPUs evenly between sessions and
    applies a process's niceness only within its session; torchrun starts every rank in
    a session of its own, so a tenant's process niceness alone changes nothing against
    the ranks. With `session` the niceness is therefore also set on the tenant's session
    (/proc/PID/autogroup, see sched(7)), which is what makes it a background job there;
    without, it is what `nice -n N` alone gives."""
    tenants = []
    for _ in range(n):
        t = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        tenants.append(t)
        os.setpriority(os.PRIO_PROCESS, t.pid, nice)
        if idle:  # lowering one's own policy needs no privilege
            os.sched_setscheduler(t.pid, os.SCHED_IDLE, os.sched_param(0))
        if session and autogroup_enabled():
            try:
                Path(f"/proc/{t.pid}/autogroup").write_text(f"{nice}\n")
            except OSError as e:
                stop_tenants(tenants)
                raise SystemExit(
                    f"cannot set the tenants' session niceness (/proc/{t.pid}/autogroup: "
                    f"{e.strerror}); use --busy-nice-scope process to measure `nice` alone"
                ) from e
    return tenants


def stop_tenants(tenants: list[subprocess.Popen]) -> None:
    """Kill and reap them (no zombies left behind)."""
    for t in tenants:
        t.kill()
        t.wait()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_steal_s() -> float | None:
    """CPU-seconds the hypervisor has taken from this machine's virtual CPUs since boot
    (/proc/stat's `steal`, summed over CPUs); None where the kernel does not report it."""
    try:
        # The first line: "cpu user nice system idle iowait irq softirq steal ..."
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def _conditions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, list]:
    """{"base": the flags after --, "versus": those plus --versus's}, the train flags checked
    before anything starts: a one-line error names the bad one."""
    from dflash import train_cli

    conditions = {"base": list(args.flags)}
    if args.versus is not None:
        extra = shlex.split(args.versus)
        if not extra:
            parser.error("--versus needs `dflash train` flags, e.g. --versus=--pin-cpus")
        conditions["versus"] = conditions["base"] + extra
    for name, flags in conditions.items():
        where = "--versus" if name == "versus" else "the flags after --"
        try:
            unknown = train_cli.parser(exit_on_error=False).parse_known_args(flags)[1]
        except argparse.ArgumentError as e:
            parser.error(f"{where}: {e}")
        if unknown:
            parser.error(f"{where}: not `dflash train` flags: {' '.join(unknown)}")
    return conditions


def _medians(rows: list[dict], tenants: bool) -> dict:
    """One condition's efficiencies, their median (with its 95% interval from 6 repeats
    on) and the medians of the efficiency's factors."""
    effs = [float(r["efficiency"]) for r in rows]
    out: dict = {"efficiency": [round(e, 3) for e in effs]}
    keys = ["drafter_compute", "drafter_cpu_share", "drafter_work_efficiency"]
    for key in keys + (["tenant_cpu", "cpu_bound", "efficiency_of_bound"] if tenants else []):
        out[f"median_{key}"] = round(statistics.median(float(r[key]) for r in rows), 3)
    steal = [r["steal"] for r in rows if r["steal"] is not None]
    out["median_steal"] = round(statistics.median(steal), 3) if steal else None
    ci = median_interval(effs)
    out["median_efficiency_ci95"] = [round(x, 3) for x in ci] if ci else None
    out["median_efficiency"] = round(statistics.median(effs), 3)
    return out


def _run(args: argparse.Namespace, conditions: dict[str, list], tenants: list) -> int:
    from dflash.train_cli import config_of

    out = Path(args.out or tempfile.mkdtemp(prefix="dflash-eff-"))
    base = ["--wandb", "off", "--targets", str(args.targets), "--drafters", str(args.drafters)]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows: dict[str, list[dict]] = {name: [] for name in conditions}
    probe = (lambda: sum(_cpu_seconds(t.pid) for t in tenants)) if tenants else None
    names = list(conditions)
    for i in range(args.repeats):
        for name in names if i % 2 == 0 else names[::-1]:  # ABBA: drift weighs on both
            run = ["--out", str(out / (f"run{i}" if len(names) == 1 else f"run{i}-{name}"))]
            cfg = config_of(base + run + conditions[name])
            stolen0, t0 = host_steal_s(), time.perf_counter()
            if args.interleave:
                got = measure_interleaved(cfg, args.batches, args.interleave, tenant_cpu=probe)
            else:
                got = measure(cfg, args.batches, tenant_cpu=probe)
            stolen1, took = host_steal_s(), time.perf_counter() - t0
            # CPU-seconds per second that the host took from this VM over the repeat
            steal = None if stolen0 is None or stolen1 is None else (stolen1 - stolen0) / took
            row = {"condition": name, **got, "steal": steal}
            rows[name].append(row)
            print(json.dumps(row), flush=True)
    summary: dict = {"repeats": args.repeats, "load_average": round(os.getloadavg()[0], 2)}
    if tenants:
        summary.update(tenant_settings(args))
        summary["autogroup"] = autogroup_enabled()
    if "versus" in rows:
        ratios = [
            v["efficiency"] / b["efficiency"]
            for b, v in zip(rows["base"], rows["versus"], strict=True)
        ]
        versus = _medians(rows["versus"], bool(tenants))
        summary.update(
            {"versus_flags": args.versus, **{f"versus_{k}": x for k, x in versus.items()}}
        )
        summary["versus_over_base"] = [round(r, 3) for r in ratios]
        summary["versus_ahead"] = f"{sum(r > 1 for r in ratios)} of {len(ratios)}"
        summary["wilcoxon_p"] = round(paired_ratio_p(ratios), 4)
        summary["median_versus_over_base"] = round(statistics.median(ratios), 3)
    summary.update(_medians(rows["base"], bool(tenants)))  # median_efficiency last, as before
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
