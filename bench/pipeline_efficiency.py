"""Pipeline efficiency of a T-target + D-drafter run (dflash/bench/capacity.py), as JSON:

    .venv/bin/python bench/pipeline_efficiency.py --targets 1 --drafters 1 --out /tmp/eff \
        -- --max-steps 30 --log-every 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

from dflash.bench.capacity import measure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, required=True)
    parser.add_argument("--drafters", type=int, required=True)
    parser.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    parser.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = parser.parse_args(argv)
    from dflash.train_cli import add_arguments, config_from_args

    train_parser = argparse.ArgumentParser()
    add_arguments(train_parser)
    out = args.out or tempfile.mkdtemp(prefix="dflash-eff-") + "/run"
    base = ["--out", out, "--wandb", "off", "--targets", str(args.targets)]
    base += ["--drafters", str(args.drafters)]
    cfg = config_from_args(train_parser.parse_args(base + args.flags))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(measure(cfg), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
