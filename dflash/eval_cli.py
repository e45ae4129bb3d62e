"""`dflash eval`: speculative decoding with a trained drafter; the last line is the summary JSON."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="local HF target directory")
    parser.add_argument("--drafter", required=True, help="drafter directory (RUN/drafter)")
    parser.add_argument(
        "--prompts", required=True, help="JSONL: 'messages' or 'prompt' per row, optional 'id'"
    )
    parser.add_argument("--out", default=None, help="per-prompt JSONL (default: none)")
    parser.add_argument("--block-size", type=int, default=None, help="default: the trained one")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N prompts")
    parser.add_argument(
        "--check-lossless", action="store_true", help="compare with the target's greedy generate"
    )
    parser.add_argument(
        "--speedup-prompts",
        type=int,
        default=16,
        help="prompts timed at bs 1 and at --block-size for the speedup (0 = skip)",
    )
    parser.add_argument(
        "--truncate-prompts",
        action="store_true",
        help="left-truncate prompts that do not fit the context (reported) instead of failing",
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda")


def run(args: argparse.Namespace) -> int:
    import torch

    from dflash.data.sources import DataError
    from dflash.evaluate import evaluate, fit_context, load_pair, load_prompts
    from dflash.target import TargetMismatch

    try:
        model, tok, drafter = load_pair(args.target, args.drafter, args.device)
        bs = args.block_size or drafter.block_size
        prompts = load_prompts(args.prompts, tok, args.limit)
        room = model.config.max_position_embeddings - args.max_new_tokens - bs
        fit_context(prompts, room, args.truncate_prompts)
        with torch.inference_mode():
            summary = evaluate(
                model,
                tok,
                drafter,
                prompts,
                block_size=bs,
                max_new_tokens=args.max_new_tokens,
                check_lossless=args.check_lossless,
                speedup_prompts=min(args.speedup_prompts, len(prompts)),
                out_path=args.out,
            )
    except (TargetMismatch, DataError, ValueError, OSError) as e:
        print(f"dflash eval: {e}", file=sys.stderr)
        return 1
    line = f"tau {summary['tau']:.3f} at bs {bs} | {summary['ms_per_token']:.2f} ms/token"
    if "speedup" in summary:
        line += f" | speedup {summary['speedup']:.2f}x vs bs 1"
    if "lossless" in summary:
        n_bad = len(summary["mismatches"])
        line += " | lossless: " + ("yes" if not n_bad else f"NO ({n_bad} prompts differ)")
    print(line, file=sys.stderr)
    print(json.dumps(summary))
    return 0 if summary.get("lossless", True) else 4
