"""Time `dflash doctor` and `dflash env fingerprint` on a clean environment.

    python bench/bench_doctor.py [--python PATH] [--runs N] [--verify] [--case NAME ...]

Each command runs N times as a fresh process (what a user or the trainer's
preflight pays); prints min / median / max wall seconds and the median CPU
seconds (user + system of the command and the probes it waits for). The machine
is shared: wall time grows with the load, CPU time much less, so compare medians
measured side by side in one run, and give the load average (printed) with them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(
    cmd: list[str], runs: int
) -> tuple[list[float], list[float], subprocess.CompletedProcess]:
    walls, cpus, last = [], [], None
    for _ in range(runs):
        cpu0, start = _children_cpu(), time.perf_counter()
        last = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        cpus.append(_children_cpu() - cpu0)  # counts grandchildren that were waited for
    assert last is not None
    return walls, cpus, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="environment to audit")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also time `doctor --no-import --verify` (hashes every installed file: "
        "tens of seconds for a torch environment)",
    )
    base = [sys.executable, "-m", "dflash.cli"]
    no_import = [*base, "doctor", "--json", "--no-import", "--python"]
    cases = {
        "doctor": [*base, "doctor", "--json", "--python"],  # imports torch in a subprocess
        "no-import": no_import,
        "fingerprint": [*base, "env", "fingerprint", "--python"],
        "verify": [*no_import[:-1], "--verify", "--python"],
    }
    parser.add_argument(
        "--case",
        action="append",
        choices=sorted(cases),
        help="time only these (repeatable; default: all but verify, which --verify adds)",
    )
    args = parser.parse_args()
    chosen = args.case or [c for c in cases if c != "verify" or args.verify]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"python: {args.python}; {args.runs} runs each; load average {load}")
    for name in chosen:
        cmd = [*cases[name], args.python]
        subprocess.run(cmd, cwd=REPO, capture_output=True)  # warm the page cache
        walls, cpus, last = time_command(cmd, args.runs)
        status = f"exit {last.returncode}"
        if "--json" in cmd:
            counts = json.loads(last.stdout)["counts"]
            status += f", {counts['error']} error(s), {counts['warning']} warning(s)"
        print(
            f"{name:<12} wall min {min(walls):5.2f} s  median {statistics.median(walls):5.2f} s  "
            f"max {max(walls):5.2f} s  cpu median {statistics.median(cpus):5.2f} s  ({status})"
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average after: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
