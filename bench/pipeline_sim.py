"""The pipeline at real topologies, simulated (dflash/distributed/simulate.py): one line of
JSON per run with the efficiency over the profile's slowest stage and the bottleneck line.

    .venv/bin/python bench/pipeline_sim.py --topology 5+3 --profile reference --steps 150

Built-in profiles (derivation in docs/bench.md, "Pipeline at real topologies (simulated)"):
  reference   a drafter step of 49152 token slots in about 4 s -> 12288 tok/s per drafter;
              20K tok/s with 2 drafters on 8 GPUs, i.e. 6 targets -> 20000/6 tok/s per target
  swapped     the same two per-rank rates exchanged, so that the drafters are the slow side
A path to a JSON profile works too (the fields of simulate.Profile).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from dflash.distributed.simulate import Profile, run_topology

DRAFTER = 49152 / 4.0  # token slots per drafter step / seconds per step
TARGET = 20000 / 6  # tok/s with 2 drafters on 8 GPUs, over its 6 targets
PROFILES = {
    "reference": Profile("reference", target_tok_per_s=TARGET, drafter_tok_per_s=DRAFTER),
    "swapped": Profile("swapped", target_tok_per_s=DRAFTER, drafter_tok_per_s=TARGET),
}


def profile_path(name: str, tmp: Path, time_scale: float | None) -> Path:
    # A file is read here first so that a bad field fails once, not in every rank.
    profile = PROFILES[name] if name in PROFILES else Profile.load(name)
    if time_scale is not None:
        profile = dataclasses.replace(profile, time_scale=time_scale)
    path = tmp / "profile.json"
    path.write_text(json.dumps(dataclasses.asdict(profile)))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", action="append", required=True, help="T+D, repeatable")
    parser.add_argument("--profile", default="reference", help=f"{sorted(PROFILES)} or a path")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-in-flight", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=3072)
    parser.add_argument("--time-scale", type=float, help="real s per simulated s (profile's)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dflash-sim-"))
    path = profile_path(args.profile, tmp, args.time_scale)
    for topo in args.topology:
        try:
            t, d = (int(x) for x in topo.split("+"))
        except ValueError:
            parser.error(f"--topology {topo!r}: expected T+D, e.g. 5+3")
        for i in range(args.repeats):
            res = run_topology(
                t, d, path, args.steps, tmp / f"run-{t}-{d}-{i}",
                rows=args.rows, seq_len=args.seq_len, max_in_flight=args.max_in_flight,
            )  # fmt: skip
            print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
