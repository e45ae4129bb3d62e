"""`python -m dflash.distributed.rank_cli FLAGS`: one pipeline rank, without the preflight.

For tests and benchmarks that build their own torchrun command (launch.torchrun_command
with module=RANK_MODULE). `dflash train` itself runs ranks through train_cli.
`--simulate PROFILE.json`: stage costs from a hardware profile (simulate.py).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    import argparse

    from dflash.distributed.pipeline import run
    from dflash.train_cli import add_arguments, config_from_args

    parser = argparse.ArgumentParser(prog="python -m dflash.distributed.rank_cli")
    add_arguments(parser)
    parser.add_argument(
        "--simulate",
        metavar="PROFILE.json",
        help="stage costs from a hardware profile (dflash/distributed/simulate.py)",
    )
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    sim = None
    if args.simulate:
        from dflash.distributed.simulate import Profile, ProfileError

        try:
            sim = Profile.load(args.simulate)
        except ProfileError as e:
            parser.error(str(e))
    summary = run(cfg, sim=sim)
    return 128 + (summary["signal"] or 0) if summary["interrupted"] else 0


if __name__ == "__main__":
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sys.exit(main())
