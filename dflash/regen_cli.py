"""`dflash regen`: target-regenerated training data (local HF target or OpenAI server)."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--target", help="local HF target directory")
    src.add_argument(
        "--server-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:30000 (vLLM/SGLang)"
    )
    parser.add_argument("--prompts", required=True, help="JSONL: 'messages' or 'prompt', opt. 'id'")
    parser.add_argument("--out", required=True, help="output JSONL (appended; resumable)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument(
        "--batch-size", type=int, default=16, help="prompts per batch / request wave"
    )
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--server-model", default=None, help="model name (default: first listed)")
    parser.add_argument("--concurrency", type=int, default=8, help="parallel server requests")
    parser.add_argument("--device", default="cpu", help="local target: cpu | cuda")


def run(args: argparse.Namespace) -> int:
    from dflash.data.sources import DataError
    from dflash.regen import LocalGenerator, ServerGenerator, regenerate

    gen: LocalGenerator | ServerGenerator
    try:
        if args.server_url:
            gen = ServerGenerator(
                args.server_url,
                max_new_tokens=args.max_new_tokens,
                model=args.server_model,
                concurrency=args.concurrency,
            )
        else:
            gen = LocalGenerator(
                args.target, max_new_tokens=args.max_new_tokens, device=args.device
            )
        stats = regenerate(
            args.prompts, args.out, gen, batch_size=args.batch_size, limit=args.limit
        )
    except (DataError, ConnectionError, OSError, ValueError) as e:
        print(f"dflash regen: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dflash regen: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    print(json.dumps(stats))
    return 0
