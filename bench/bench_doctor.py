"""Time `dflash doctor` and `dflash env fingerprint` on a clean environment.

    python bench/bench_doctor.py [--python PATH] [--runs N] [--verify]

Each command runs N times as a fresh process (what a user or the trainer's
preflight pays); prints min / median / max wall seconds. The machine is shared:
compare medians measured side by side in one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def time_command(cmd: list[str], runs: int) -> tuple[list[float], subprocess.CompletedProcess]:
    times, last = [], None
    for _ in range(runs):
        start = time.perf_counter()
        last = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    assert last is not None
    return times, last


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
    args = parser.parse_args()
    base = [sys.executable, "-m", "dflash.cli"]
    cases = {
        "doctor (imports torch in a subprocess)": [
            *base,
            "doctor",
            "--json",
            "--python",
            args.python,
        ],
        "doctor --no-import": [*base, "doctor", "--json", "--no-import", "--python", args.python],
        "env fingerprint": [*base, "env", "fingerprint", "--python", args.python],
    }
    if args.verify:
        cases["doctor --no-import --verify"] = [*cases["doctor --no-import"], "--verify"]
    print(f"python: {args.python}; {args.runs} runs each")
    for name, cmd in cases.items():
        subprocess.run(cmd, cwd=REPO, capture_output=True)  # warm the page cache
        times, last = time_command(cmd, args.runs)
        status = f"exit {last.returncode}"
        if "--json" in cmd:
            report = json.loads(last.stdout)
            status += f", {report['counts']['error']} error(s)"
        print(
            f"{name:<42} min {min(times):5.2f} s  median {statistics.median(times):5.2f} s  "
            f"max {max(times):5.2f} s  ({status})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
