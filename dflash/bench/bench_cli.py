"""`dflash bench`: run a workload, keep the record, compare with the accepted baseline.

  dflash bench run [--workload tiny-cpu] [--repeats N] [--image IMG] [--store DIR]
  dflash bench accept [RECORD] [--workload W] [--reason TEXT] [--force]
  dflash bench compare BASELINE CURRENT      (record ids or files)
  dflash bench bisect GOOD BAD               (venvs or record ids: the changes that slow training)
  dflash bench history [--workload W] [--out DIR]
  dflash bench list [--workload W]
Exit codes: 0 pass / improvement / no baseline yet, 1 regression, 3 refused
(not comparable), 2 usage or run failure.
First run of a (hardware, workload, CUDA variant) key: the record becomes the baseline
automatically if the doctor finds the environment clean (otherwise it is only
recorded); later runs compare against it until `dflash bench accept` promotes another.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dflash.bench.compare import ALPHA, Comparison, compare
from dflash.bench.store import STORE_ENV, BenchInputError, Store, baseline_key
from dflash.bench.workloads import PAIR_MODES, WORKLOADS

RECORD_MARKER = "DFLASH_BENCH_RECORD:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    store_help = f"results store (default ${STORE_ENV} or ~/.cache/dflash/bench)"

    run = sub.add_parser("run", help="run a workload and compare with its baseline")
    run.add_argument("--workload", default="tiny-cpu", choices=sorted(WORKLOADS))
    run.add_argument("--repeats", type=int, help="override the workload's repeat count")
    run.add_argument("--store", help=store_help)
    run.add_argument("--image", help="run inside this image (e.g. dflash:cu128)")
    run.add_argument("--engine", default="auto", choices=("auto", "docker", "buildah"))
    run.add_argument("--no-auto-accept", action="store_true", help="never auto-accept")
    run.add_argument(
        "--no-paired",
        action="store_true",
        help="compare with the stored baseline numbers only (faster, weaker: another hour's "
        "load) instead of measuring the baseline's environment beside this one",
    )
    run.add_argument(
        "--pair-mode",
        choices=PAIR_MODES,
        help="a pair's two repeats at the same time, one core each, or back to back "
        "(default: the workload's; tiny-cpu: concurrent)",
    )
    run.add_argument("--alpha", type=float, default=ALPHA, help="significance level")
    run.add_argument("--min-effect", type=float, help="e.g. 0.05 = 5%% (default: the workload's)")
    run.add_argument("--json-out", help="also write the record to this file")
    run.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)  # in-image half

    acc = sub.add_parser("accept", help="promote a record to its key's baseline")
    acc.add_argument("record", nargs="?", help="record id or file (default: latest here)")
    acc.add_argument("--workload", default="tiny-cpu")
    acc.add_argument("--reason", default="accepted by hand")
    acc.add_argument("--force", action="store_true", help="accept a dirty-environment run")
    acc.add_argument("--store", help=store_help)

    cmp_ = sub.add_parser("compare", help="compare two records")
    cmp_.add_argument("baseline")
    cmp_.add_argument("current")
    cmp_.add_argument("--alpha", type=float, default=ALPHA)
    cmp_.add_argument("--min-effect", type=float, help="default: the workload's")
    cmp_.add_argument("--json", action="store_true")
    cmp_.add_argument("--store", help=store_help)

    hist = sub.add_parser("history", help="markdown report and PNG of tok/s over time")
    hist.add_argument("--workload", default="tiny-cpu")
    hist.add_argument("--out", help="output directory (default: STORE/report)")
    hist.add_argument("--store", help=store_help)

    from dflash.bench.bisect import add_arguments as add_bisect

    add_bisect(sub)

    wk = sub.add_parser("worker", help="one repeat in this process (used by `run`)")
    wk.add_argument("spec", help="workload definition (JSON file)")
    wk.add_argument("out", help="where to write the repeat's result (JSON)")

    ls = sub.add_parser("list", help="list stored records")
    ls.add_argument("--workload")
    ls.add_argument("--store", help=store_help)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the workload here and build its record: paired with the accepted baseline's
    environment when it can be rebuilt (the default verdict), else alone."""
    from dflash.bench.envs import BenchEnv
    from dflash.bench.hardware import hardware_fingerprint
    from dflash.bench.lockenv import save_lock
    from dflash.bench.record import build_record, collect_environment
    from dflash.bench.runner import run_pairs, run_repeats, summarize
    from dflash.bench.workloads import get_workload

    w = get_workload(args.workload)
    if args.repeats:
        w = w.with_changes(repeats=args.repeats)
    if args.pair_mode:
        w = w.with_changes(pair_mode=args.pair_mode)
    store = Store(args.store)
    env = collect_environment(_log)
    env["lock"] = save_lock(store.root, env["doctor"].get("lock"))
    hw = hardware_fingerprint()
    key = baseline_key({"workload": {"name": w.name}, "environment": env, "hardware": hw})
    base_env, why = baseline_environment(store, store.baseline(key), args)
    _log(f"dflash bench: {w.name} ({w.topology}), {w.repeats} repeats x {w.steps} steps")
    if base_env is None:
        _log(f"  no paired baseline: {why}")
        repeats = run_repeats(w, _log)
        rec = build_record(w, repeats, summarize(w, repeats), hw, env)
        rec["paired"] = {"available": False, "reason": why}
        return rec
    _log(f"  paired with the baseline environment ({base_env.origin}), order alternating")
    cand, base = run_pairs(w, BenchEnv.current(), base_env, _log)
    rec = build_record(w, cand, summarize(w, cand), hw, env)
    rec["paired"] = {
        "available": True,
        "env": base_env.describe(),
        "repeats": base,
        "summary": summarize(w, base),
    }
    return rec


def baseline_environment(store: Store, base: dict[str, Any] | None, args) -> tuple[Any, str]:
    """(BenchEnv of the accepted baseline's environment, "") or (None, why not)."""
    from dflash.bench.lockenv import LockEnvError, lock_env

    if args.no_paired:
        return None, "--no-paired"
    if args.emit:
        return None, "the in-image half of an image run (the host pairs images)"
    if base is None:
        return None, "no accepted baseline yet"
    lock = base["environment"].get("lock")
    if not lock:
        return None, f"baseline {base['id']} stored no lock (recorded before paired runs)"
    try:
        env = lock_env(store.root, lock["sha256"], base["environment"].get("variant"), _log)
    except LockEnvError as exc:
        return None, str(exc)
    return with_baseline_variables(env, base), ""


def with_baseline_variables(env: Any, base: dict[str, Any]) -> Any:
    """The baseline's speed-relevant variables are part of its environment: its repeats
    run with the values recorded for it, and without the ones only this run has."""
    import dataclasses

    from dflash.bench.worker import relevant_variables

    recorded = base.get("settings", {}).get("variables", {}) or {}
    unset = tuple(k for k in relevant_variables() if k not in recorded)
    return dataclasses.replace(env, variables=dict(recorded), unset=unset)


def add_image_pairs(store: Store, rec: dict[str, Any], args: argparse.Namespace) -> None:
    """Pairs of containers, candidate image and the baseline's image (image_env.py)."""
    from dflash.bench.image_env import image_pair_envs
    from dflash.bench.runner import RepeatFailed, run_pairs, summarize
    from dflash.bench.workloads import Workload

    envs = (
        "--no-paired" if args.no_paired else image_pair_envs(rec, store.baseline(baseline_key(rec)))
    )
    if isinstance(envs, str):
        _log(f"  no paired baseline: {envs}")
        rec["paired"] = {"available": False, "reason": envs}
        return
    cand, base = envs
    w = Workload.from_definition(rec["workload"]["definition"])
    _log(f"  paired with the baseline's {base.origin}, one container per repeat")
    try:
        c, b = run_pairs(w, cand, base, _log)
    except RepeatFailed as exc:  # e.g. a baseline image from before `bench worker`
        _log(f"  no paired verdict: {exc}")
        rec["paired"] = {"available": False, "reason": f"a paired repeat failed: {exc}"}
        return
    rec["paired"] = {
        "available": True,
        "env": base.describe(),
        "repeats": b,
        "summary": summarize(w, b),
        "candidate_repeats": c,
        "candidate_summary": summarize(w, c),
    }


def verdict_for(store: Store, rec: dict[str, Any], args) -> tuple[Comparison | None, Any]:
    base = store.baseline(baseline_key(rec))
    if base is None:
        return None, None
    return compare(base, rec, args.alpha, args.min_effect), base


def do_run(args: argparse.Namespace) -> int:
    from dflash.bench.report import comparison_lines, run_summary

    if args.image:
        from dflash.bench.image import run_in_image

        rec = run_in_image(args, _log)
        if not args.emit:
            add_image_pairs(Store(args.store), rec, args)
    else:
        rec = measure(args)
    if args.emit:  # inside an image: hand the record to the host, which stores it
        print(RECORD_MARKER + json.dumps(rec), flush=True)
        return 0
    store = Store(args.store)
    comp, base = verdict_for(store, rec, args)
    rec["comparison"] = comp.to_dict() if comp else None
    path = store.add(rec)
    print("\n".join(run_summary(rec)))
    print(f"record: {path}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
    if comp is None:
        return first_run(store, rec, args)
    print("\n".join(comparison_lines(base, rec, comp)))
    return comp.exit_code


def first_run(store: Store, rec: dict[str, Any], args: argparse.Namespace) -> int:
    key = baseline_key(rec)
    if args.no_auto_accept or rec["environment"]["dirty"]:
        why = "the environment is dirty" if rec["environment"]["dirty"] else "--no-auto-accept"
        print(f"no baseline for {key}; recorded only ({why}). Promote with `just bench-accept`.")
        return 0
    if store.accept(rec, reason="first clean run of this key (auto)", only_if_absent=True):
        print(f"no baseline for {key}: this run is now the baseline (auto-accepted)")
    else:
        print(f"a concurrent run became the baseline of {key} first; this one is recorded")
    return 0


def do_accept(args: argparse.Namespace) -> int:
    store = Store(args.store)
    if args.record:
        rec = store.find(args.record)
    else:
        from dflash.bench.hardware import hardware_fingerprint

        # A store may be shared by several machines: the latest run on this one.
        here = hardware_fingerprint()["key"]
        recs = [r for r in store.records(args.workload) if r["hardware"]["key"] == here]
        if not recs:
            print(f"no records of {args.workload} from this machine in {store.root}")
            return 2
        rec = recs[-1]
    if rec["environment"].get("dirty") and not args.force:
        print(f"record {rec['id']} ran in a dirty environment; --force to accept it anyway")
        return 2
    old = store.baseline(baseline_key(rec))
    store.accept(rec, reason=args.reason)
    print(f"baseline of {baseline_key(rec)}: {old['id'] if old else 'none'} -> {rec['id']}")
    return 0


def do_compare(args: argparse.Namespace) -> int:
    from dflash.bench.report import comparison_lines

    store = Store(args.store)
    base, cur = store.find(args.baseline), store.find(args.current)
    comp = compare(base, cur, args.alpha, args.min_effect)
    if args.json:
        print(json.dumps(comp.to_dict(), indent=1))
    else:
        print("\n".join(comparison_lines(base, cur, comp)))
    return comp.exit_code


def do_list(args: argparse.Namespace) -> int:
    store = Store(args.store)
    for r in store.records(args.workload):
        c = r.get("comparison") or {}
        print(
            f"{r['id']}  {r['workload']['name']:<14} {r['summary']['median']:>12,.0f} "
            f"{r['summary']['unit']:<10} {c.get('verdict', '-'):<11} "
            f"{str(r['environment']['key'])[:16]}"
        )
    return 0


def check_args(args: argparse.Namespace) -> None:
    """Flag values that would fail later, named now."""
    for flag in ("repeats", "pairs"):
        n = getattr(args, flag, None)
        if n is not None and n < 2:
            raise BenchInputError(f"--{flag} {n}: at least 2 (a verdict needs pairs)")
    steps = getattr(args, "steps", None)
    if steps is not None and steps < 1:
        raise BenchInputError(f"--steps {steps}: at least 1")
    alpha = getattr(args, "alpha", None)
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise BenchInputError(f"--alpha {alpha}: a significance level in (0, 1), e.g. 0.05")
    eff = getattr(args, "min_effect", None)
    if eff is not None and not 0.0 <= eff < 1.0:
        raise BenchInputError(f"--min-effect {eff}: a fraction in [0, 1), e.g. 0.05 for 5%")
    store = getattr(args, "store", None)
    if store and Path(store).exists() and not Path(store).is_dir():
        raise BenchInputError(f"--store {store}: not a directory")


def run(args: argparse.Namespace) -> int:
    import signal

    from dflash.bench.envs import exit_on_signal
    from dflash.bench.runner import RepeatFailed

    # the repeat in flight is killed with us (envs.run_worker), not left running
    signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        check_args(args)
        if args.action == "run":
            return do_run(args)
        if args.action == "accept":
            return do_accept(args)
        if args.action == "compare":
            return do_compare(args)
        if args.action == "bisect":
            from dflash.bench.bisect import run_bisect

            return run_bisect(args, _log)
        if args.action == "worker":
            from dflash.bench.worker import main as worker_main

            return worker_main([args.spec, args.out])
        if args.action == "history":
            from dflash.bench.history import write_history

            store = Store(args.store)
            md, png = write_history(store, args.workload, args.out or store.root / "report")
            print(f"wrote {md} and {png}")
            return 0
        return do_list(args)
    except BenchInputError as exc:
        print(f"dflash bench {args.action}: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # a name that is not there: say which, not just its repr
        print(f"dflash bench {args.action}: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except (RepeatFailed, OSError, RuntimeError) as exc:  # SpliceError is a RuntimeError
        print(f"dflash bench {args.action}: {exc}", file=sys.stderr)
        return 2
