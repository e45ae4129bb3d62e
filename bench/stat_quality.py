"""Statistical quality of `dflash bench` on this machine: false alarms and detection.

Runs the real CLI (`python -m dflash.cli bench run`, doctor and repeats included)
into a scratch store, in this order:
  N0, then for i = 1..SAME: N_i, and for i <= SLOW also S_i right after N_i
N = unchanged environment, S = the same with one environment change (default
ATEN_CPU_CAPABILITY=default: ATen's vector kernels fall back to scalar code, the
kind of silent slowdown a stray variable in a job script causes). Every comparison
is recomputed offline from the stored records with dflash.bench.compare, two ways:
  chain  N_i vs N_{i-1}, S_i vs N_i           (each pair measured minutes apart)
  fixed  N_i vs N0,      S_i vs N0            (one baseline accepted once, as nightly)
and for S it checks that the environment diff names the changed variable. It prints
and writes (--out) the counts, each ratio, the slow change's measured cost and the
wall time of every bench run. Others' load on the machine is part of the noise; the
load average is recorded with each run.

  .venv/bin/python bench/stat_quality.py [--same 20] [--slow 10] [--out FILE]
  .venv/bin/python bench/stat_quality.py --analyze STORE   (recompute from N*/S*.json)
The verdicts use the harness defaults; `thresholds` repeats the counts for other
minimum effects on the same runs (what a different --min-effect would have done).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflash.bench.compare import compare
from dflash.bench.envdiff import environment_diff
from dflash.bench.stats import median


def bench(store: str, workload: str, extra_env: dict[str, str], tag: str) -> dict:
    out = Path(store) / f"{tag}.json"
    env = {**os.environ, **extra_env}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dflash.cli", "bench", "run", "--workload", workload,
         "--store", store, "--no-auto-accept", "--json-out", str(out)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{tag}: bench exited {proc.returncode}\n{proc.stderr[-3000:]}")
    rec = json.loads(out.read_text())
    rec["_wall_s"], rec["_load"] = wall, os.getloadavg()[0]
    out.write_text(json.dumps(rec))  # keep wall time and load for --analyze
    print(f"{tag}: {rec['summary']['median']:,.0f} {rec['summary']['unit']} "
          f"in {wall:.0f} s (load {rec['_load']:.1f})", flush=True)  # fmt: skip
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--same", type=int, default=20)
    ap.add_argument("--slow", type=int, default=10)
    ap.add_argument("--slow-env", default="ATEN_CPU_CAPABILITY=default")
    ap.add_argument("--workload", default="tiny-cpu")
    ap.add_argument("--store", help="scratch store (default: a new temporary directory)")
    ap.add_argument("--out", default="stat_quality.json")
    ap.add_argument("--analyze", metavar="STORE", help="only recompute from a finished run")
    args = ap.parse_args()
    var, _, value = args.slow_env.partition("=")
    if args.analyze:
        store = args.analyze
        n, s = _load(store, "N"), _load(store, "S")
    else:
        store = args.store or tempfile.mkdtemp(prefix="dflash-statq-")
        print(f"store {store}; slow change {var}={value}", flush=True)
        n = [bench(store, args.workload, {}, "N0")]
        s = []
        for i in range(1, args.same + 1):
            n.append(bench(store, args.workload, {}, f"N{i}"))
            if i <= args.slow:
                s.append(bench(store, args.workload, {var: value}, f"S{i}"))
    analyze(n, s, var, args, store)
    return 0


def _load(store: str, prefix: str) -> list[dict]:
    recs, i = [], 0 if prefix == "N" else 1
    while (Path(store) / f"{prefix}{i}.json").exists():
        recs.append(json.loads((Path(store) / f"{prefix}{i}.json").read_text()))
        i += 1
    return recs


def analyze(n: list[dict], s: list[dict], var: str, args, store: str) -> None:
    def verdict(base: dict, cur: dict, min_effect: float | None = None) -> dict:
        c = compare(base, cur, min_effect=min_effect)
        return {"ratio": c.ratio, "ci": c.ci, "p": c.p_slower, "verdict": c.verdict,
                "names_change": any(var in line for line in environment_diff(base, cur))}  # fmt: skip

    same_chain = [verdict(n[i - 1], n[i]) for i in range(1, len(n))]
    same_fixed = [verdict(n[0], n[i]) for i in range(1, len(n))]
    slow_chain = [verdict(n[i + 1], s[i]) for i in range(len(s))]
    slow_fixed = [verdict(n[0], s[i]) for i in range(len(s))]

    def flagged(rows: list[dict]) -> int:
        return sum(r["verdict"] == "regression" for r in rows)

    thresholds = {}
    for eff in (0.05, 0.08, 0.10):
        same = [verdict(n[i - 1], n[i], eff) for i in range(1, len(n))]
        slow = [verdict(n[i + 1], s[i], eff) for i in range(len(s))]
        thresholds[f"{eff:.2f}"] = {"same_flagged": f"{flagged(same)}/{len(same)}",
                                    "slow_flagged": f"{flagged(slow)}/{len(slow)}"}  # fmt: skip
    walls = [r.get("_wall_s", 0.0) for r in n + s]
    result = {
        "workload": args.workload,
        "slow_env": args.slow_env,
        "same_flagged_chain": f"{flagged(same_chain)}/{len(same_chain)}",
        "same_flagged_fixed": f"{flagged(same_fixed)}/{len(same_fixed)}",
        "slow_flagged_chain": f"{flagged(slow_chain)}/{len(slow_chain)}",
        "slow_flagged_fixed": f"{flagged(slow_fixed)}/{len(slow_fixed)}",
        "slow_change_named": f"{sum(r['names_change'] for r in slow_chain)}/{len(slow_chain)}",
        "slow_cost_median_ratio": median([r["ratio"] for r in slow_chain]) if s else None,
        "same_ratio_range": [min(r["ratio"] for r in same_chain), max(r["ratio"] for r in same_chain)],
        "bench_wall_s": {"median": median(walls), "max": max(walls)},
        "thresholds_chain": thresholds,
        "same_ratios_chain": [round(r["ratio"], 3) for r in same_chain],
        "slow_ratios_chain": [round(r["ratio"], 3) for r in slow_chain],
        "load_avg": [r.get("_load") for r in n + s],
        "same_chain": same_chain, "same_fixed": same_fixed,
        "slow_chain": slow_chain, "slow_fixed": slow_fixed,
        "store": store,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    for k, v in result.items():
        if not isinstance(v, list) or k in (
            "same_ratio_range",
            "same_ratios_chain",
            "slow_ratios_chain",
            "load_avg",
        ):
            print(f"{k}: {v}")


if __name__ == "__main__":
    sys.exit(main())
