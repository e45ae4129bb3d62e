"""`dflash` command line: a thin dispatcher.

Each subcommand `dflash X` lives in its own module, `<x>_cli.py` beside the code it
drives, exposing `add_arguments(parser)` and `run(args) -> int` and nothing else. Modules are imported lazily so that light commands (doctor,
env manifest) do not pay for importing torch and transformers up front.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("dflash.train_cli", "train a DFlash drafter"),
    "doctor": ("dflash.envcheck.doctor_cli", "audit this Python environment against uv.lock"),
    "env": ("dflash.envcheck.env_cli", "environment fingerprint and manifest"),
    "image": ("dflash.envcheck.image_cli", "diff two images' environments, never starting them"),
    "eval": ("dflash.eval_cli", "speculative decoding with a drafter: tau, speedup, lossless"),
    "regen": ("dflash.regen_cli", "regenerate responses with the target (local or OpenAI server)"),
    "bench": ("dflash.bench.bench_cli", "throughput benchmark against a stored baseline"),
    "demo": ("dflash.demo.demo_cli", "offline end-to-end demo on CPU: target, data, drafter, eval"),
    "gpu-check": (
        "dflash.gpu_check_cli",
        "GPU readiness: doctor, compiled qwen3-8b steps, bench record, NCCL pipeline",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflash", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Build only the parser of the requested command, so `dflash doctor` does not
    # import the trainer (and torch) just to print its help.
    if argv and argv[0] in COMMANDS:
        module, help_text = COMMANDS[argv[0]]
        parser = argparse.ArgumentParser(prog=f"dflash {argv[0]}", description=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(parser)
        return int(mod.run(parser.parse_args(argv[1:])) or 0)
    build_parser().parse_args(argv)  # prints usage / help and exits
    return 2


if __name__ == "__main__":
    sys.exit(main())
