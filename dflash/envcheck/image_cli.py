"""`dflash image diff A B [--json] [--engine ...]`: image_diff.py's report over two images
(or venvs, manifests), read without starting them."""

from __future__ import annotations

import argparse

from .image_diff import add_diff_arguments, run_diff


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    diff = sub.add_parser("diff", help="what differs between two images (or venvs, manifests)")
    add_diff_arguments(diff, images=True)


def run(args: argparse.Namespace) -> int:
    return run_diff(args, "dflash image diff", images=True)
