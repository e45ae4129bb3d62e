"""`dflash doctor`: audit a Python environment against uv.lock and the image manifest.

Exit status: 0 when there is no error (warnings and info allowed; --strict
fails on warnings too), 1 otherwise. `--list-codes` prints every finding code.
"""

from __future__ import annotations

import argparse
import sys

from .paths import DFLASH_LOCK_ENV
from .settings import DEVICES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        metavar="PATH",
        help="interpreter whose environment to audit (a venv's bin/python or the venv "
        "directory); default: the one running dflash",
    )
    parser.add_argument(
        "--lock",
        metavar="PATH",
        help=f"uv.lock to audit against (default: ${DFLASH_LOCK_ENV}, the project root, "
        "or the copy baked into the image)",
    )
    parser.add_argument("--extra", help="the extra the env was synced with (default: detected)")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument(
        "--no-import",
        action="store_true",
        help="do not import torch in a subprocess (skips the mapped-library checks; faster)",
    )
    parser.add_argument(
        "--cache-root", metavar="DIR", help="root of the fingerprint-keyed compile caches"
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="what the run will use: with cuda, settings that hide the GPUs are errors and "
        "a failed GPU query is a warning (default: auto)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="hash every installed file against its RECORD sha256 and keep the baseline "
        "(the default run compares sizes, and hashes the files changed since the last "
        "--verify or the image build)",
    )
    parser.add_argument("--quiet", action="store_true", help="hide info findings (human report)")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings as well")
    parser.add_argument(
        "--list-codes", action="store_true", help="print the finding codes and exit"
    )


def run(args: argparse.Namespace) -> int:
    if args.list_codes:
        from .findings import CODES

        sys.stdout.write("".join(f"{code:<24} {what}\n" for code, what in CODES.items()))
        return 0

    from .collect import ProbeError, start_probes

    # The probes first: the doctor's own imports (packaging, the checks) and the lock
    # parse then overlap the interpreters' work instead of coming before it.
    try:
        probes = start_probes(args.python, import_torch=not args.no_import)
    except ProbeError:
        probes = None  # run_doctor tries again and reports why as a finding

    from .doctor import run_doctor
    from .doctor_report import render_human, render_json

    report = run_doctor(
        python=args.python,
        lock=args.lock,
        extra=args.extra,
        import_torch=not args.no_import,
        cache_root=args.cache_root,
        device=args.device,
        verify=args.verify,
        probes=probes,
    )
    text = render_json(report) if args.json else render_human(report, show_info=not args.quiet)
    sys.stdout.write(text + "\n")
    if args.strict and report.counts()["warning"]:
        return 1
    return report.exit_code
