"""`dflash demo`: the whole product offline on CPU: target, data, drafter, eval, plot."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dflash.demo.recipe import CACHE_ENV, RECIPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default=None, help="run directory (default: runs/demo-YYYYmmdd-HHMMSS)"
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help=f"target/data cache root (default: ${CACHE_ENV} or ~/.cache/dflash/demo)",
    )
    parser.add_argument("--recipe", default="default", choices=sorted(RECIPES))
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--arch",
        default="dflash",
        choices=("dflash", "dflash2"),
        help="dflash2: also train a DFlash2 drafter on the same data and budget, and "
        "report its tau next to DFlash's",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from dflash.demo.recipe import cache_root
    from dflash.demo.stages import run_demo

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out or time.strftime("runs/demo-%Y%m%d-%H%M%S"))
    if out.exists() and any(out.iterdir()):
        print(f"dflash demo: {out} is not empty; choose another --out", file=sys.stderr)
        return 2
    try:
        s = run_demo(RECIPES[args.recipe], cache_root(args.cache_dir), out, args.arch)
    except KeyboardInterrupt:
        print(
            "dflash demo: interrupted; run it again: the cached target and regenerated data "
            "are reused (regeneration resumes where it stopped)",
            file=sys.stderr,
        )
        return 130
    verdict = "PASS" if s["lossless"] else f"FAIL ({len(s['mismatches'])} prompts differ)"
    bs = s["block_size"]
    print(
        f"\n[demo] tau {s['tau']:.2f} at block size {bs} on {s['prompts']} held-out prompts"
        f" | accepted-length histogram {s['accept_hist']}"
        f"\n[demo] speedup {s['speedup']:.2f}x vs block size 1"
        f" ({s['ms_per_token_bs1']:.1f} -> {s['ms_per_token_timed']:.1f} ms/token)"
        f"\n[demo] lossless vs target greedy generate: {verdict}"
        f"\n[demo] plot {s['plot']} | total {s['total_s']:.0f} s wall, {s['cpu_s']:.0f} s CPU {s['times']}"
        f"\n[demo] re-evaluate: dflash eval --target {s['target']} --drafter {s['drafter']}"
        f" --prompts {s['eval_prompts']} --limit {s['prompts']}"
        f" --max-new-tokens {s['recipe']['eval_max_new_tokens']} --check-lossless"
    )
    two = s.get(args.arch) if args.arch != "dflash" else None
    if two is not None:
        print(
            f"[demo] {args.arch} vs dflash, same data and {s['recipe']['draft_steps']} steps: "
            f"tau {two['tau']:.2f} vs {s['tau']:.2f} at block size {bs}"
            f" | speedup {two['speedup']:.2f}x vs {s['speedup']:.2f}x"
            f" | lossless: {'PASS' if two['lossless'] else 'FAIL'}"
        )
    print(json.dumps({k: s[k] for k in s if k != "recipe"}))
    return 0 if s["lossless"] and (two is None or two["lossless"]) else 4
