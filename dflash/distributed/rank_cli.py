"""`python -m dflash.distributed.rank_cli FLAGS`: one pipeline rank, without the preflight.

For tests and benchmarks that build their own torchrun command (launch.torchrun_command
with module=RANK_MODULE). `dflash train` itself runs ranks through train_cli.
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
    cfg = config_from_args(parser.parse_args(argv))
    summary = run(cfg)
    return 128 + (summary["signal"] or 0) if summary["interrupted"] else 0


if __name__ == "__main__":
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sys.exit(main())
