"""Statistical quality of `dflash bench` on this machine: false alarms and detection.

Runs the real CLI (`python -m dflash.cli bench run`, doctor and repeats included)
into a scratch store, in this order:
  N0, then for i = 1..SAME: N_i, and for i <= SLOW also S1_i, S2_i, ... right after
N = unchanged environment, Sk = the same with the k-th environment change (defaults:
MKL_ENABLE_INSTRUCTIONS=AVX2, MKL's kernels capped at AVX2 on an AVX-512 host, which
cost tiny-cpu 13% here, and ATEN_CPU_CAPABILITY=avx2, the same for ATen's own kernels,
9%: the kind of silent slowdown a stray variable in a job script causes). Every
comparison is recomputed offline from the stored records with dflash.bench.compare,
two ways:
  chain  N_i vs N_{i-1}, Sk_i vs N_i       (each pair measured a minute apart)
  fixed  N_i vs N0,      Sk_i vs N0        (one baseline accepted once, as nightly)
and for S it checks that the environment diff names the changed variable. When the
workload has the machine-speed reference, the same comparisons are also made on its
uncorrected samples (tok/cpu-s), to show what the correction buys on the same runs.
It prints and writes (--out) the counts, each ratio, each change's measured cost and
the wall time of every bench run. `--load N` keeps N extra busy processes running
for the whole measurement (other tenants' jobs on a shared machine).

  .venv/bin/python bench/stat_quality.py [--same 20] [--slow 10] [--slow-env V=X ...]
  .venv/bin/python bench/stat_quality.py --analyze STORE   (recompute from N*/S*.json)
  ... --analyze STORE --power P   (corrected samples recomputed from the stored steps
                                   with correction power P, as that workload would)
`thresholds` repeats the chain counts for other minimum effects on the same runs
(what a different --min-effect would have done).
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflash.bench.compare import compare
from dflash.bench.envdiff import environment_diff
from dflash.bench.stats import median

DEFAULT_SLOW = ["MKL_ENABLE_INSTRUCTIONS=AVX2", "ATEN_CPU_CAPABILITY=avx2"]


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
    print(f"{tag}: {rec['summary']['median']:,.1f} {rec['summary']['unit']} "
          f"in {wall:.0f} s (load {rec['_load']:.1f})", flush=True)  # fmt: skip
    return rec


def _busy(seed: int) -> None:
    """Another tenant: allocation, copying and integer work, forever."""
    import random

    rng = random.Random(seed)
    blob = bytearray(rng.randbytes(48 << 20))
    while True:
        bytes(blob)
        sorted(rng.getrandbits(20) for _ in range(200_000))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--same", type=int, default=20)
    ap.add_argument("--slow", type=int, default=10)
    ap.add_argument("--slow-env", action="append", help=f"V=X (repeatable; default {DEFAULT_SLOW})")
    ap.add_argument("--workload", default="tiny-cpu")
    ap.add_argument("--load", type=int, default=0, help="extra busy processes meanwhile")
    ap.add_argument("--store", help="scratch store (default: a new temporary directory)")
    ap.add_argument("--out", default="stat_quality.json")
    ap.add_argument("--analyze", metavar="STORE", help="only recompute from a finished run")
    ap.add_argument("--power", type=float, help="with --analyze: recompute with this power")
    args = ap.parse_args()
    if args.power is not None and not args.analyze:
        ap.error("--power recomputes a finished run: use it with --analyze STORE")
    changes = [c.partition("=")[::2] for c in (args.slow_env or DEFAULT_SLOW)]
    if args.analyze:
        store = args.analyze
        n = _load(store, "N", 0)
        s = {var: _load(store, f"S{k + 1}_", 1) for k, (var, _) in enumerate(changes)}
        if args.power is not None:
            n = [repowered(r, args.power) for r in n]
            s = {var: [repowered(r, args.power) for r in recs] for var, recs in s.items()}
    else:
        store = args.store or tempfile.mkdtemp(prefix="dflash-statq-")
        print(f"store {store}; changes {changes}; {args.load} busy processes", flush=True)
        load = [mp.Process(target=_busy, args=(i,), daemon=True) for i in range(args.load)]
        for p in load:
            p.start()
        try:
            n = [bench(store, args.workload, {}, "N0")]
            s = {var: [] for var, _ in changes}
            for i in range(1, args.same + 1):
                n.append(bench(store, args.workload, {}, f"N{i}"))
                for k, (var, value) in enumerate(changes):
                    if i <= args.slow:
                        s[var].append(bench(store, args.workload, {var: value}, f"S{k + 1}_{i}"))
        finally:
            for p in load:
                p.kill()
    result = analyze(n, s, args, store)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _load(store: str, prefix: str, first: int) -> list[dict]:
    recs, i = [], first
    while (Path(store) / f"{prefix}{i}.json").exists():
        recs.append(json.loads((Path(store) / f"{prefix}{i}.json").read_text()))
        i += 1
    return recs


def repowered(rec: dict, power: float) -> dict:
    """The record with its corrected samples recomputed from its steps at `power`."""
    from dflash.bench.reference import corrected
    from dflash.bench.runner import repeat_sample
    from dflash.bench.workloads import Workload

    out = copy.deepcopy(rec)
    w = Workload.from_definition(out["workload"]["definition"])
    samples = []
    for rp in out["repeats"]:
        for st in rp["steps"]:
            st["tok_per_ref"] = corrected(st["tok_per_cpu_s"], st["ref_s"], power)
        samples.append(repeat_sample(w, rp["steps"]))
    out["summary"]["samples"] = samples
    out["summary"]["median"] = median(samples)
    return out


def uncorrected(rec: dict) -> dict:
    """The record as the bench without the machine-speed reference would have seen it."""
    out = copy.deepcopy(rec)
    s = out["summary"]
    s["samples"], s["metric"] = s["uncorrected_samples"], s["uncorrected_metric"]
    s.pop("reference_s", None)
    return out


def counts(n: list[dict], s: dict[str, list[dict]], min_effect: float | None = None) -> dict:
    def verdict(base: dict, cur: dict, var: str | None = None) -> dict:
        c = compare(base, cur, min_effect=min_effect)
        named = var is not None and any(var in line for line in environment_diff(base, cur))
        return {"ratio": c.ratio, "ci": c.ci, "p": c.p_slower, "verdict": c.verdict,
                "names_change": named}  # fmt: skip

    def flagged(rows: list[dict]) -> str:
        return f"{sum(r['verdict'] == 'regression' for r in rows)}/{len(rows)}"

    same_chain = [verdict(n[i - 1], n[i]) for i in range(1, len(n))]
    same_fixed = [verdict(n[0], n[i]) for i in range(1, len(n))]
    out: dict[str, Any] = {
        "same_flagged_chain": flagged(same_chain),
        "same_flagged_fixed": flagged(same_fixed),
        "same_ratio_range_chain": _range(same_chain),
        "same_ratio_range_fixed": _range(same_fixed),
        "same_ratios_chain": [round(r["ratio"], 3) for r in same_chain],
        "same_ratios_fixed": [round(r["ratio"], 3) for r in same_fixed],
    }
    for var, recs in s.items():
        chain = [verdict(n[i + 1], recs[i], var) for i in range(len(recs))]
        fixed = [verdict(n[0], recs[i], var) for i in range(len(recs))]
        out[var] = {
            "flagged_chain": flagged(chain),
            "flagged_fixed": flagged(fixed),
            "named_in_diff": f"{sum(r['names_change'] for r in chain)}/{len(chain)}",
            "cost_median_ratio_chain": round(median([r["ratio"] for r in chain]), 3)
            if chain
            else None,
            "ratios_chain": [round(r["ratio"], 3) for r in chain],
        }
    return out


def _flags(c: dict) -> dict:
    """Just the flagged counts of a `counts` result."""
    out = {k: v for k, v in c.items() if k.startswith("same_flagged")}
    for var, v in c.items():
        if isinstance(v, dict):
            out[var] = f"chain {v['flagged_chain']}, fixed {v['flagged_fixed']}"
    return out


def _range(rows: list[dict]) -> list[float]:
    return [round(min(r["ratio"] for r in rows), 3), round(max(r["ratio"] for r in rows), 3)]


def analyze(n: list[dict], s: dict[str, list[dict]], args, store: str) -> dict:
    walls = [r.get("_wall_s", 0.0) for r in n + [x for v in s.values() for x in v]]
    result = {
        "workload": args.workload,
        "store": store,
        "runs": len(walls),
        "bench_wall_s": {"median": round(median(walls), 1), "max": round(max(walls), 1)},
        "load_avg": [round(r.get("_load", 0.0), 2) for r in n],
        "defaults": counts(n, s),
        "thresholds": {f"{eff:.2f}": _flags(counts(n, s, eff)) for eff in (0.03, 0.05, 0.07, 0.10)},
    }
    if "uncorrected_samples" in n[0]["summary"]:
        un = {var: [uncorrected(r) for r in recs] for var, recs in s.items()}
        result["uncorrected"] = counts([uncorrected(r) for r in n], un)
        ref = [median(r["summary"]["reference_s"]) * 1e3 for r in n]
        result["reference_ms_range"] = [round(min(ref), 2), round(max(ref), 2)]
    print(json.dumps({k: v for k, v in result.items() if k != "load_avg"}, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(main())
