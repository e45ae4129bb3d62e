"""False alarms and detection of the paired verdict, with the real CLI, on this machine.

One baseline run (auto-accepted; its lock is stored), then SAME unchanged runs and,
interleaved, SLOW runs of each change, every one a real `dflash bench run` that
measures the baseline's environment (rebuilt from the stored lock) beside the
candidate. `--phase` says when one extra busy process (another tenant) runs:
  none       never
  candidate  from after the baseline run to the end: a load starts between the two
  baseline   only during the baseline run: the baseline's stored numbers come from a
             loaded hour, the candidates run quiet (the case that cried wolf before)
Changes (candidates only): a variable (`VAR=VALUE`, applied to the candidate; the
baseline's repeats run with the variables recorded for it) or `pkg:BUSY/IDLE`, a
package whose .pth file starts a thread that holds the GIL BUSY seconds in every
BUSY + IDLE (installed into a copy of the locked environment).
For each run it keeps the paired and the stored-number verdicts, whether the report
names the change, and the bench's wall time.

  .venv/bin/python bench/paired_quality.py --phase none --same 20 --slow 10 --out q.json

`--analyze STORE` recomputes a finished study's paired verdicts from its stored samples,
uncorrected (as shipped) and reference-corrected, with the spread of one pair's log ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stat_quality import _busy  # the same "other tenant" as the stored-number study

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CHANGES = ["MKL_ENABLE_INSTRUCTIONS=AVX2", "pkg:0.0005/0.0045"]


def candidate_python(change: str, scratch: Path) -> tuple[Path, dict[str, str], str]:
    """(interpreter, extra variables, the name the report must show) of a change."""
    if not change.startswith("pkg:"):
        var, _, value = change.partition("=")
        return Path(sys.executable), {var: value}, f"{var}={value}"
    sys.path.insert(0, str(REPO / "tests"))
    from wheels import busy_thread_wheel

    from dflash.bench.lockenv import lock_env, save_lock

    busy, idle = (float(x) for x in change[4:].split("/"))
    saved = save_lock(scratch, REPO / "uv.lock")
    assert saved is not None, "uv.lock missing"
    sha = saved["sha256"]
    py = lock_env(scratch, sha, "cu128", label="contaminated").python
    name = "busy-telemetry"
    wheel = busy_thread_wheel(scratch / "wheels", name, busy, idle)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(py), str(wheel)], check=True)
    return py, {}, name


def bench(python: Path, store: Path, extra: dict[str, str], tag: str, *args: str) -> dict:
    out = store / f"{tag}.json"
    env = {**os.environ, **extra}
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(python.parent / "dflash"), "bench", "run", "--store", str(store), "--json-out",
         str(out), *args],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{tag}: bench exited {proc.returncode}\n{proc.stderr[-3000:]}")
    rec = json.loads(out.read_text())
    c = rec.get("comparison") or {}
    row = {
        "tag": tag,
        "exit": proc.returncode,
        "method": c.get("method"),
        "verdict": c.get("verdict"),
        "ratio": c.get("ratio"),
        "ci": c.get("ci"),
        "p": c.get("p_slower"),
        "stored_verdict": c.get("stored_verdict"),
        "stored_ratio": c.get("stored_ratio"),
        "corrected_ratio": (c.get("paired") or {}).get("corrected_ratio"),
        "stdout": proc.stdout,
        "wall_s": time.perf_counter() - t0,
        "load": os.getloadavg()[0],
    }
    print(
        f"{tag}: exit {row['exit']} {row['verdict']} {row['ratio'] or 0:.3f}x "
        f"(stored {row['stored_verdict']} {row['stored_ratio'] or 0:.3f}x) "
        f"in {row['wall_s']:.0f} s, load {row['load']:.1f}",
        flush=True,
    )
    return row


def summary(rows: list[dict], name: str | None = None) -> dict:
    def frac(pred) -> str:
        return f"{sum(pred(r) for r in rows)}/{len(rows)}"

    out = {
        "flagged": frac(lambda r: r["exit"] == 1),
        "stored_flagged": frac(lambda r: r["stored_verdict"] == "regression"),
        "ratios": [round(r["ratio"], 3) for r in rows if r["ratio"]],
        "stored_ratios": [round(r["stored_ratio"], 3) for r in rows if r["stored_ratio"]],
        "corrected_ratios": [round(r["corrected_ratio"], 3) for r in rows if r["corrected_ratio"]],
        "wall_s": [round(r["wall_s"]) for r in rows],
    }
    if name is not None:
        out["named"] = frac(lambda r: name in r["stdout"])
    return out


def analyze(store: Path) -> dict[str, Any]:
    """Each run's paired verdict recomputed on both kinds of sample (the shipped rule)."""
    import math
    import statistics

    from dflash.bench.paired import paired_verdict

    out: dict[str, Any] = {}
    for kind, pattern in (("unchanged", "N*.json"), ("changed", "S*.json")):
        files = sorted(store.glob(pattern))
        for key in ("uncorrected_samples", "samples"):
            flagged, ratios, logs = 0, [], []
            for f in files:
                rec = json.loads(f.read_text())
                cand, base = rec["summary"][key], rec["paired"]["summary"][key]
                v = paired_verdict(cand, base, 0.05, rec["comparison"]["min_effect"])
                flagged += v.verdict == "regression"
                ratios.append(v.ratio)
                logs += [math.log(c / b) for c, b in zip(cand, base, strict=True)]
            if files:
                out[f"{kind}/{key}"] = {
                    "flagged": f"{flagged}/{len(files)}",
                    "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                    "pair_log_ratio_sd": round(statistics.stdev(logs), 3),
                    "pairs": len(logs),
                }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("none", "candidate", "baseline"), default="none")
    ap.add_argument("--same", type=int, default=20)
    ap.add_argument("--slow", type=int, default=10)
    ap.add_argument("--change", action="append", help=f"default {DEFAULT_CHANGES}")
    ap.add_argument("--repeats", type=int, help="pairs per run (default: the workload's)")
    ap.add_argument("--out", default="paired_quality.json")
    ap.add_argument("--analyze", metavar="STORE", help="recompute a finished study's verdicts")
    args = ap.parse_args()
    if args.analyze:
        print(json.dumps(analyze(Path(args.analyze)), indent=1))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="dflash-pairq-", dir=Path.home() / ".cache"))
    store = scratch / "store"
    store.mkdir()
    extra_args = ("--repeats", str(args.repeats)) if args.repeats else ()
    changes = {
        c: candidate_python(c, scratch / f"c{i}")
        for i, c in enumerate(args.change or DEFAULT_CHANGES)
    }
    load: list[mp.Process] = []

    def start_load() -> None:
        load.append(mp.Process(target=_busy, args=(len(load),), daemon=True))
        load[-1].start()

    def stop_load() -> None:
        while load:
            load.pop().kill()

    if args.phase == "baseline":
        start_load()
    base = bench(Path(sys.executable), store, {}, "B0", *extra_args)
    assert "auto-accepted" in base["stdout"], base["stdout"]
    stop_load()
    if args.phase == "candidate":
        start_load()
    same: list[Any] = []
    slow: dict[str, list[Any]] = {c: [] for c in changes}

    def save() -> dict[str, Any]:  # after every run: an interrupted study keeps its counts
        result = {
            "phase": args.phase,
            "pairs": args.repeats,
            "store": str(store),
            "baseline": {k: base[k] for k in ("wall_s", "load")},
            "unchanged": summary(same),
            **{c: summary(rows, changes[c][2]) for c, rows in slow.items() if rows},
            "runs": [
                {k: v for k, v in r.items() if k != "stdout"}
                for r in [*same, *sum(slow.values(), [])]
            ],
        }
        Path(args.out).write_text(json.dumps(result, indent=1))
        return result

    try:
        for i in range(1, args.same + 1):
            same.append(bench(Path(sys.executable), store, {}, f"N{i}", *extra_args))
            save()
            for k, (change, (py, env, _)) in enumerate(changes.items()):
                if i <= args.slow:
                    slow[change].append(bench(py, store, env, f"S{k + 1}_{i}", *extra_args))
                    save()
    finally:
        stop_load()
    result = save()
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
