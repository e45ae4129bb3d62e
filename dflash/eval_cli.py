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
    sampling = parser.add_argument_group(
        "sampling", "temperature > 0: speculative rejection sampling, lossless in distribution"
    )
    sampling.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default), else > 0"
    )
    sampling.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 = off"
    )
    sampling.add_argument("--top-k", type=int, default=0, help="keep the k likeliest; 0 = off")
    sampling.add_argument("--seed", type=int, default=0, help="seed of the sampling stream")


def run(args: argparse.Namespace) -> int:
    import torch

    from dflash.data.sources import DataError
    from dflash.evaluate import check_sampling, evaluate, fit_context, load_pair, load_prompts
    from dflash.sampling import Sampling
    from dflash.target import TargetMismatch

    try:
        # Bad sampling values fail before any model loads.
        sampling = Sampling(args.temperature, args.top_p, args.top_k, args.seed)
        check_sampling(sampling, args.check_lossless)
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
                sampling=sampling,
            )
    except (TargetMismatch, DataError, ValueError, OSError) as e:
        print(f"dflash eval: {e}", file=sys.stderr)
        return 1
    line = f"tau {summary['tau']:.3f} at bs {bs} | {summary['ms_per_token']:.2f} ms/token"
    if not sampling.greedy:
        line += (
            f" | sampled at temperature {sampling.temperature}, top-p {sampling.top_p}, "
            f"top-k {sampling.top_k}, seed {sampling.seed}"
        )
    if "speedup" in summary:
        line += f" | speedup {summary['speedup']:.2f}x vs bs 1"
    if "lossless" in summary:
        n_bad = len(summary["mismatches"])
        line += " | lossless: " + ("yes" if not n_bad else f"NO ({n_bad} prompts differ)")
    print(line, file=sys.stderr)
    print(json.dumps(summary))
    return 0 if summary.get("lossless", True) else 4
