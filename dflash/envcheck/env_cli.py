"""`dflash env`: environment fingerprint and manifest.

  dflash env fingerprint [--python PATH] [--components]
  dflash env manifest [--python PATH] [--out FILE|-] [--lock PATH] [--extra NAME]
  dflash env diff A B [--json]        (manifests, bench records or venvs)

`manifest` writes `<sys.prefix>/share/dflash/manifest.json` of the audited
environment by default: the image build runs it after `uv sync`, and the
doctor then reports any later in-place change as ENV_MUTATED.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .image_diff import add_diff_arguments, run_diff
from .paths import manifest_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    fp = sub.add_parser("fingerprint", help="print the environment fingerprint")
    fp.add_argument("--python", metavar="PATH", help="interpreter to fingerprint")
    fp.add_argument("--components", action="store_true", help="also print component digests")
    man = sub.add_parser("manifest", help="write the environment manifest (JSON)")
    man.add_argument("--python", metavar="PATH", help="interpreter to describe")
    man.add_argument(
        "--out",
        metavar="FILE",
        help="output file, '-' for stdout (default: <prefix>/share/dflash/manifest.json)",
    )
    man.add_argument("--lock", metavar="PATH", help="uv.lock (to record the extra)")
    man.add_argument("--extra", help="extra the env was synced with (default: detected)")
    diff = sub.add_parser("diff", help="what changed between two manifests, records or venvs")
    add_diff_arguments(diff, images=False)


def run(args: argparse.Namespace) -> int:
    from .collect import ProbeError

    try:
        if args.action == "fingerprint":
            return _fingerprint(args)
        if args.action == "manifest":
            return _manifest(args)
        return _diff(args)
    except (ProbeError, OSError, ValueError) as exc:
        print(f"dflash env {args.action}: {exc}", file=sys.stderr)
        return 2


def _fingerprint(args: argparse.Namespace) -> int:
    from .collect import collect_static
    from .fingerprint import components_from_probe, digests, fingerprint

    comps = components_from_probe(collect_static(args.python))
    print(fingerprint(comps))
    if args.components:
        for name, digest in digests(comps).items():
            print(f"  {name}: {digest}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    from .doctor import environment_manifest

    manifest = environment_manifest(args.python, lock=args.lock, extra=args.extra)
    text = json.dumps(manifest, indent=1, sort_keys=True)
    if args.out == "-":
        sys.stdout.write(text + "\n")
        return 0
    out = Path(args.out) if args.out else manifest_path(manifest["prefix"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out} (fingerprint {manifest['fingerprint']})")
    return 0


def _diff(args: argparse.Namespace) -> int:
    # The same report as `dflash image diff`, for files and venvs (image_diff.py).
    return run_diff(args, "dflash env diff", images=False)
