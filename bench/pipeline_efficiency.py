"""Pipeline efficiency of a T-target + D-drafter run (dflash/bench/capacity.py), as JSON:
each repeat is a pipeline run between two measurements of its stages alone (`--batches`
batches each); the last line is the median efficiency and of its factors: the drafters'
compute fraction (the rest waits on targets), the share of a core they got while computing,
and how far their CPU-seconds go against the stage alone (capacity.measure).

    .venv/bin/python bench/pipeline_efficiency.py --targets 1 --drafters 1 --repeats 5 \
        --batches 40 -- --max-steps 30 --log-every 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from dflash.bench.capacity import measure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, required=True)
    parser.add_argument("--drafters", type=int, required=True)
    parser.add_argument("--out", default=None, help="run directories' parent (default: temp)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batches", type=int, default=12, help="batches per stage alone")
    parser.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = parser.parse_args(argv)
    from dflash.train_cli import add_arguments, config_from_args

    train_parser = argparse.ArgumentParser()
    add_arguments(train_parser)
    out = Path(args.out or tempfile.mkdtemp(prefix="dflash-eff-"))
    base = ["--wandb", "off", "--targets", str(args.targets), "--drafters", str(args.drafters)]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows = []
    for i in range(args.repeats):
        run = ["--out", str(out / f"run{i}")]
        cfg = config_from_args(train_parser.parse_args(base + run + args.flags))
        rows.append(measure(cfg, args.batches))
        print(json.dumps(rows[-1]), flush=True)
    effs = [float(r["efficiency"]) for r in rows]
    summary = {"repeats": len(rows), "efficiency": [round(e, 3) for e in effs]}
    summary["load_average"] = round(os.getloadavg()[0], 2)
    for key in ("drafter_compute", "drafter_cpu_share", "drafter_work_efficiency"):
        summary[f"median_{key}"] = round(statistics.median(float(r[key]) for r in rows), 3)
    print(json.dumps({**summary, "median_efficiency": round(statistics.median(effs), 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
