"""The nightly sequence a user runs, with the literal `just` recipes, into a scratch store:

  just bench                      first run: auto-accepted baseline     -> exit 0
  just bench-accept               promote the latest record             -> exit 0
  (start one busy process)
  just bench                      unchanged environment, loaded machine -> exit 0
  (stop it)
  VAR=VALUE just bench            a slowing change                      -> exit 1, names VAR

It prints each step's exit code, verdict line and wall time, and exits 1 if any step
did not end as above. Default change: MKL_ENABLE_INSTRUCTIONS=AVX2 (MKL capped at AVX2
on an AVX-512 host).

  .venv/bin/python bench/nightly_sequence.py [--change VAR=VALUE] [--repeats N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stat_quality import _busy

REPO = Path(__file__).resolve().parents[1]


def just(store: Path, *args: str, extra: dict[str, str] | None = None) -> tuple[int, str]:
    env = {**os.environ, "DFLASH_BENCH_STORE": str(store), **(extra or {})}
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    proc = subprocess.run(["just", *args], cwd=REPO, env=env, capture_output=True, text=True)
    verdict = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(
            ("PASS", "REGRESSION", "IMPROVEMENT", "REFUSED", "baseline of", "no baseline")
        )
    ]
    print(
        f"$ {' '.join(f'{k}={v}' for k, v in (extra or {}).items())} just {' '.join(args)}"
        f"  -> exit {proc.returncode} in {time.perf_counter() - t0:.0f} s, load "
        f"{os.getloadavg()[0]:.1f}\n    " + "\n    ".join(verdict or proc.stderr.splitlines()[-3:]),
        flush=True,
    )
    return proc.returncode, proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--change", default="MKL_ENABLE_INSTRUCTIONS=AVX2")
    ap.add_argument("--repeats", type=int, help="pairs per run (default: the workload's)")
    args = ap.parse_args()
    store = Path(tempfile.mkdtemp(prefix="dflash-nightly-", dir=Path.home() / ".cache"))
    extra = ("--repeats", str(args.repeats)) if args.repeats else ()
    var, _, value = args.change.partition("=")
    ok = []
    code, out = just(store, "bench", *extra)
    ok.append(code == 0 and "auto-accepted" in out)
    code, _ = just(store, "bench-accept")
    ok.append(code == 0)
    busy = mp.Process(target=_busy, args=(0,), daemon=True)
    busy.start()
    try:
        code, out = just(store, "bench", *extra)
        ok.append(code == 0)
    finally:
        busy.kill()
    code, out = just(store, "bench", *extra, extra={var: value})
    ok.append(code == 1 and f"{var}={value}" in out)
    print(f"store {store}; steps as expected: {ok}")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
