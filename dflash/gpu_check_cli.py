"""`dflash gpu-check [--dry-run] [--store DIR] [--json-out FILE]`: the checks of
gpu_check.py, a table, then one JSON line; exit 0 when no check failed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dflash.gpu_check import run_checks, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="the same checks at tiny shapes on CPU (tiny-cpu workload, gloo pipeline)",
    )
    parser.add_argument(
        "--store",
        help="bench store for the record (default: the bench's; --dry-run: a temporary one)",
    )
    parser.add_argument("--json-out", help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads
    results = run_checks(args.dry_run, args.store)
    ok = all(r["status"] != "FAIL" for r in results)
    summary = {"gpu_check": 1, "ok": ok, "dry_run": args.dry_run, "checks": results}
    print(table(results), flush=True)
    line = json.dumps(summary, sort_keys=True, default=str)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m dflash.gpu_check_cli")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
