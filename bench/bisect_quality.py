"""How often `dflash bench bisect` names the one slow package out of 8, and how long it takes.

GOOD is the locked environment rebuilt from uv.lock (as the paired verdict rebuilds a
baseline's); BAD is a hard-link copy of it plus 8 extra packages: 7 inert ones and one
whose `.pth` starts a thread that holds the GIL BUSY seconds in every BUSY + IDLE
(`--busy 0.0005/0.0045`: 10% of the time, about a 13% slower tiny-cpu step). Every run
is the real CLI, `dflash bench bisect GOOD BAD --json`, from nothing cached between
runs but the two venvs; one JSON line per run (answer, measurements, wall time), then
the summary. Issue 15's target: the slow package alone in >= 9 of 10 runs, each within
15 minutes on the 2-core CI machine.

The differences are bisected in name order, and ddmin tries the first half first: the
default name, `busy-telemetry`, sorts before the inert `inert-extra-*` packages (the
fewest measurements, 4 for 8); `--slow-name zz-busy-telemetry` sorts it last (the most
one cause can need, 7).

    .venv/bin/python bench/bisect_quality.py --runs 10 --out bisect_quality.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def environments(
    scratch: Path, slow: str, busy: float, idle: float, inert: int
) -> tuple[Path, Path]:
    """(GOOD, BAD) venv directories; BAD holds `inert` inert packages and the slow one."""
    sys.path.insert(0, str(REPO / "tests"))
    from wheels import busy_thread_wheel, inert_wheel

    from dflash.bench.envsplice import inventory, splice
    from dflash.bench.lockenv import lock_env, save_lock

    saved = save_lock(scratch / "envs", REPO / "uv.lock")
    assert saved is not None, "uv.lock missing"
    good = lock_env(scratch / "envs", saved["sha256"], "cu128", label="good").python.parent.parent
    bad = scratch / "bad"
    same = inventory(good / "bin" / "python")
    splice(same, same, [], bad)  # a hard-link copy of GOOD, then the extra packages
    w = scratch / "wheels"
    wheels = [inert_wheel(w, f"inert-extra-{i}") for i in range(inert)]
    wheels.insert(inert // 2, busy_thread_wheel(w, slow, busy=busy, idle=idle))
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(bad / "bin" / "python"), *map(str, wheels)],
        check=True,
    )  # fmt: skip
    return good, bad


def one_run(good: Path, bad: Path, store: Path, slow: str, extra: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dflash"), "bench", "bisect", str(good), str(bad),
         "--store", str(store), "--json", *extra],
        capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"bisect exited {proc.returncode}\n{proc.stderr[-3000:]}")
    found = json.loads(proc.stdout[proc.stdout.index("\n{") + 1 :]) if "\n{" in proc.stdout else {}
    minimal = found.get("minimal", [])
    return {
        "exit": proc.returncode,
        "minimal": minimal,
        "named_alone": len(minimal) == 1 and minimal[0].split()[:2] == ["+", slow],
        "measurements": len(found.get("steps", [])),
        "ratios": [round(s["ratio"], 3) for s in found.get("steps", [])],
        "wall_s": round(wall),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--busy", default="0.0005/0.0045", help="BUSY/IDLE seconds of the slow package")
    ap.add_argument("--slow-name", default="busy-telemetry", help="the slow package's name")
    ap.add_argument("--inert", type=int, default=7, help="inert extra packages (default 7)")
    ap.add_argument("--out", default="bisect_quality.json")
    ap.add_argument("flags", nargs="*", help="more `dflash bench bisect` flags, after --")
    args = ap.parse_args()
    busy, idle = (float(x) for x in args.busy.split("/"))
    scratch = Path(tempfile.mkdtemp(prefix="dflash-bisectq-", dir=Path.home() / ".cache"))
    rows: list[dict] = []
    try:
        good, bad = environments(scratch, args.slow_name, busy, idle, args.inert)
        for i in range(args.runs):
            rows.append(one_run(good, bad, scratch / "store", args.slow_name, args.flags))
            print(json.dumps({"run": i + 1, **rows[-1]}), flush=True)
            walls = [r["wall_s"] for r in rows]
            summary = {
                "slow": args.slow_name,
                "busy": args.busy,
                "differences": args.inert + 1,
                "named_alone": f"{sum(r['named_alone'] for r in rows)}/{len(rows)}",
                "wall_s": {"min": min(walls), "median": round(statistics.median(walls)),
                           "max": max(walls)},
                "within_15_min": f"{sum(w <= 900 for w in walls)}/{len(rows)}",
                "runs": rows,
            }  # fmt: skip
            Path(args.out).write_text(json.dumps(summary, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
