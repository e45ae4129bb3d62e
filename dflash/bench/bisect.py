"""`dflash bench bisect GOOD BAD`: the smallest part of an environment change that
makes training slower.

GOOD and BAD are environments: venv directories, interpreters, bench record ids (the
record's stored lock rebuilt as a venv, lockenv.py, with the speed-relevant variables
recorded for it; an image run's record stands for its image) or images on this host
(subsets measured in containers of GOOD with BAD's files put in: image_bisect.py). Their difference is a set of distribution changes (envsplice.py) and
of speed-relevant variables (`$NAME`: the record's, or the current ones with
`--good-env/--bad-env NAME=VALUE`); delta debugging (Zeller's ddmin) then
measures environments that apply subsets of it onto GOOD, each one paired against GOOD
itself in the same run (runner.run_pairs, paired.py), and narrows the set to a minimal
one that still reproduces the slowdown: removing any single change from it makes the
slowdown go away.

A subset "reproduces" when its paired verdict against GOOD is a regression (Wilcoxon
p(slower) < alpha and ratio < 1 - min effect), the same rule as `dflash bench run`.
A round that passes but cannot rule out the minimum effect (its interval reaches
below 1 - min effect: with 5 pairs the exact test needs all five slower, and the
interval is the pairs' range) gets a second round of pairs, and the verdict is taken
on both (`inconclusive`): measured, one noisy pair, or host load over three of
five, otherwise made the culprit alone look harmless and left a non-minimal answer.
Every measurement is kept and printed with its ratio and interval; a subset is never
measured twice; Ctrl-C prints the smallest reproducing set found so far.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash.bench.envsplice import (
    VAR,
    Change,
    SpliceError,
    differences,
    inventory,
    python_of,
    splice,
)
from dflash.bench.image_bisect import (
    ImageSide,
    check_same_prefix,
    fetch_bundles,
    image_inventory,
    resolve_image,
    splice_archive,
    spliced_env,
)
from dflash.bench.image_env import ImageEnv

if TYPE_CHECKING:
    from dflash.bench.paired import PairedResult


@dataclass
class Side:
    """One end of the bisection: an interpreter and the variables its runs have."""

    python: Path
    variables: dict[str, str]
    origin: str


def _assignments(pairs: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in pairs or []:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise SpliceError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def resolve_side(ref: str, extra_vars: dict[str, str], store, log) -> Side | ImageSide:
    """A venv or interpreter (with the current speed-relevant variables), a record id
    (its lock's venv, built on first use, and its recorded variables; an image run's
    record stands for its image), or an image on this host (its ENV's variables)."""
    from dflash.bench.worker import relevant_variables

    try:
        return Side(python_of(ref), {**relevant_variables(), **extra_vars}, ref)
    except SpliceError:
        pass
    from dflash.bench.lockenv import lock_env
    from dflash.bench.store import BenchInputError

    try:
        rec = store.find(ref)
    except BenchInputError:
        return resolve_image(ref, extra_vars)
    env = rec.get("environment", {})
    if env.get("kind") == "image" and (env.get("image") or {}).get("id"):
        return resolve_image(env["image"]["id"], extra_vars, f"record {rec['id']} (image)")
    lock = env.get("lock")
    if not lock:
        raise SpliceError(f"record {rec['id']} stored no lock: its environment cannot be rebuilt")
    built = lock_env(store.root, lock["sha256"], env.get("variant"), log, label=rec["id"])
    recorded = rec.get("settings", {}).get("variables", {}) or {}
    return Side(built.python, {**recorded, **extra_vars}, f"record {rec['id']}")


class HostEnvs:
    """Subsets as hard-link venvs on this host (envsplice.splice)."""

    def __init__(self, good: Side, bad: Side, work: Path) -> None:
        self.good, self.bad, self.work = good, bad, work
        self.good_inv, self.bad_inv = inventory(good.python), inventory(bad.python)

    def good_env(self):
        return bench_env(self.good.python, "good", self.good.variables, self.good.origin)

    def subset_env(self, subset: list[Change], k: int, everything: bool):
        if everything:
            return bench_env(self.bad.python, "bad", self.bad.variables, self.bad.origin)
        dists = [c for c in subset if not c.name.startswith(VAR)]
        python = self.good.python
        if dists:
            python = splice(self.good_inv, self.bad_inv, dists, self.work / f"step{k}")
        variables = subset_variables(self.good.variables, subset)
        return bench_env(python, f"step{k}", variables, f"GOOD + {len(subset)} changes")

    def cleanup(self, k: int) -> None:
        shutil.rmtree(self.work / f"step{k}", ignore_errors=True)


class ImageEnvs:
    """Subsets as containers of GOOD's image with BAD's files put in (image_bisect.py)."""

    def __init__(self, good: ImageSide, bad: ImageSide, work: Path, gpus: bool) -> None:
        self.good, self.bad, self.work, self.gpus = good, bad, work, gpus
        self.good_inv, self.bad_inv = image_inventory(good), image_inventory(bad)
        check_same_prefix(self.good_inv, self.bad_inv)
        self.bundles: Path | None = None

    def _image_env(self, side: ImageSide, label: str) -> ImageEnv:
        return ImageEnv(
            side.info, label, "docker-api", self.gpus, side.client,
            variables=dict(side.variables), origin_text=side.origin,
        )  # fmt: skip

    def good_env(self):
        return self._image_env(self.good, "good")

    def subset_env(self, subset: list[Change], k: int, everything: bool):
        if everything:
            return self._image_env(self.bad, "bad")
        if self.bundles is None:  # BAD's files of every difference, copied out once
            every = differences(self.good_inv, self.bad_inv)
            self.bundles = fetch_bundles(self.bad, self.bad_inv, every, self.work / "bundles")
        variables = subset_variables(self.good.variables, subset)
        unset = sorted(set(self.good.variables) - set(variables))
        archive = splice_archive(
            self.good_inv, subset, self.bundles, variables, unset, self.work / f"step{k}.tar"
        )
        origin = f"GOOD's image + {len(subset)} changes"
        return spliced_env(self.good_env(), archive, f"step{k}", origin)

    def cleanup(self, k: int) -> None:
        (self.work / f"step{k}.tar").unlink(missing_ok=True)  # containers go after each repeat


def variable_changes(good: dict[str, str], bad: dict[str, str]) -> list[Change]:
    names = sorted(set(good) | set(bad))
    kinds = {(True, False): "removed", (False, True): "added", (True, True): "changed"}
    return [
        Change(VAR + n, kinds[(n in good, n in bad)], good.get(n), bad.get(n))
        for n in names
        if good.get(n) != bad.get(n)
    ]


def subset_variables(good: dict[str, str], subset: list[Change]) -> dict[str, str]:
    """GOOD's variables with the subset's variable changes applied."""
    out = dict(good)
    for c in subset:
        if c.name.startswith(VAR):
            if c.bad is None:
                out.pop(c.name[len(VAR) :], None)
            else:
                out[c.name[len(VAR) :]] = c.bad
    return out


def bench_env(python: Path, label: str, variables: dict[str, str], origin: str):
    """A BenchEnv whose runs have exactly `variables` among the speed-relevant ones."""
    from dflash.bench.envs import BenchEnv
    from dflash.bench.worker import relevant_variables

    unset = tuple(k for k in relevant_variables() if k not in variables)
    return BenchEnv(python, label, origin=origin, variables=dict(variables), unset=unset)


def inconclusive(pr: PairedResult, min_effect: float) -> bool:
    """A pass that does not rule out a slowdown of the minimum effect: its interval
    reaches below 1 - min_effect. Seen in CI (2026-12-07): the slow package alone read
    0.980x [0.774, 1.051] over 5 pairs (the median pair near 1, the slowest at 0.774)
    and was taken as harmless, so the answer was it and an inert package."""
    return pr.verdict == "pass" and pr.ci[0] < 1.0 - min_effect


def ddmin_bound(n: int) -> int:
    """Measurements ddmin may need for n changes at worst (Zeller and Hildebrandt,
    2002: n^2 + 3n tests), plus the first one that confirms BAD is slower."""
    return n * n + 3 * n + 1


def single_cause_count(n: int) -> int:
    """Measurements when one change is the cause: the confirmation, then at most two
    per halving."""
    return 1 + 2 * math.ceil(math.log2(n)) if n > 1 else 1


def ddmin(changes: list[Change], slow: Callable[[list[Change]], bool], best: list) -> list[Change]:
    """A 1-minimal subset of `changes` for which `slow` holds (it holds for all of
    them). `best[0]` always holds the smallest reproducing subset found so far."""
    c, n = list(changes), 2
    best[:] = [c]
    while len(c) >= 2:
        size = math.ceil(len(c) / n)
        chunks = [c[i : i + size] for i in range(0, len(c), size)]
        for chunk in chunks:  # a chunk alone reproduces: keep only it
            if slow(chunk):
                c, n = chunk, 2
                break
        else:
            for chunk in chunks if len(chunks) > 2 else []:  # complements (n=2: the chunks)
                rest = [x for x in c if x not in chunk]
                if slow(rest):
                    c, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(c):
                    break
                n = min(len(c), 2 * n)
                continue
        best[:] = [c]
    return c


def run_bisect(args: argparse.Namespace, log: Callable[[str], object]) -> int:
    from tqdm import tqdm

    from dflash.bench.compare import paired_samples
    from dflash.bench.image import wants_gpus
    from dflash.bench.paired import paired_verdict
    from dflash.bench.runner import run_pairs, summarize
    from dflash.bench.store import Store
    from dflash.bench.workloads import get_workload

    store = Store(args.store)
    g_side = resolve_side(args.good, _assignments(args.good_env, "--good-env"), store, log)
    b_side = resolve_side(args.bad, _assignments(args.bad_env, "--bad-env"), store, log)
    work = store.root / "bisect" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    envs: HostEnvs | ImageEnvs
    if isinstance(g_side, Side) and isinstance(b_side, Side):
        envs = HostEnvs(g_side, b_side, work)
    elif isinstance(g_side, ImageSide) and isinstance(b_side, ImageSide):
        envs = ImageEnvs(g_side, b_side, work, wants_gpus(args.workload))
    else:
        raise SpliceError(
            f"GOOD is {g_side.origin} and BAD is {b_side.origin}: both must be images, or "
            "both venvs/record ids of host runs (`dflash image diff` compares an image with "
            "a venv's manifest)"
        )
    changes = differences(envs.good_inv, envs.bad_inv)
    changes += variable_changes(g_side.variables, b_side.variables)
    if not changes:
        print(
            f"GOOD ({args.good}) and BAD ({args.bad}) hold the same distributions and "
            "speed-relevant variables"
        )
        return 0
    w = get_workload(args.workload).with_changes(repeats=args.pairs)
    if args.steps:  # only compared within this run, so the step count is free
        w = w.with_changes(steps=args.steps)
    min_effect = args.min_effect if args.min_effect is not None else w.min_effect
    bound = ddmin_bound(len(changes))
    print(f"{len(changes)} differences between GOOD and BAD:")
    print("\n".join(f"  {c}" for c in changes))
    print(
        f"at most {bound} paired measurements of {args.pairs} pairs, {2 * args.pairs} when "
        f"inconclusive ({w.name}); "
        f"{single_cause_count(len(changes))} if a single change is the cause"
    )
    work.mkdir(parents=True, exist_ok=True)
    good_env = envs.good_env()
    steps: list[dict[str, Any]] = []
    cache: dict[frozenset[str], bool] = {}
    bar = tqdm(total=bound, desc="bisect", unit="measurement", file=sys.stderr)

    def slow(subset: list[Change]) -> bool:
        key = frozenset(c.name for c in subset)
        if key in cache:
            return cache[key]
        k = len(steps)
        env = envs.subset_env(subset, k, everything=len(subset) == len(changes))
        try:
            cand: list[dict[str, Any]] = []
            base: list[dict[str, Any]] = []
            pr = None
            while pr is None or (inconclusive(pr, min_effect) and len(cand) < 2 * args.pairs):
                c, b = run_pairs(w, env, good_env, lambda _: None, args.pairs)
                cand, base = cand + c, base + b
                pr = paired_verdict(
                    paired_samples(summarize(w, cand)), paired_samples(summarize(w, base)),
                    args.alpha, min_effect,
                )  # fmt: skip
        finally:
            envs.cleanup(k)
        cache[key] = pr.verdict == "regression"
        steps.append({"changes": [str(c) for c in subset], **pr.to_dict(), "slow": cache[key]})
        bar.update(1)
        bar.write(
            f"  {k + 1}. {'SLOW' if cache[key] else 'ok  '} {pr.ratio:.3f}x "
            f"[{pr.ci[0]:.3f}, {pr.ci[1]:.3f}] p={pr.p_slower:.4f} ({pr.pairs} pairs)  "
            + (", ".join(str(c) for c in subset) if len(subset) <= 6 else f"{len(subset)} changes")
        )
        return cache[key]

    best: list[list[Change]] = [changes]
    try:
        if not slow(changes):
            bar.close()
            print(f"BAD is not slower than GOOD ({steps[0]['ratio']:.3f}x): nothing to bisect")
            return 0
        found = ddmin(changes, slow, best)
        bar.close()
        _report(found, steps, args, "minimal set that reproduces the slowdown")
        return 1
    except KeyboardInterrupt:
        bar.close()
        _report(best[0], steps, args, "interrupted; smallest reproducing set so far")
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _report(found: list[Change], steps: list[dict[str, Any]], args, title: str) -> None:
    print(f"{len(steps)} measurements; {title}:")
    for c in found:
        print(f"  {c}")
    if args.json:
        print(json.dumps({"minimal": [str(c) for c in found], "steps": steps}, indent=1))


def add_arguments(sub) -> None:
    b = sub.add_parser("bisect", help="find the part of an environment change that slows training")
    b.add_argument("good", help="the fast environment: a venv, its python, a record id or an image")
    b.add_argument("bad", help="the slow environment: a venv, its python, a record id or an image")
    for side in ("good", "bad"):
        b.add_argument(
            f"--{side}-env",
            action="append",
            metavar="NAME=VALUE",
            help=f"a speed-relevant variable of {side.upper()}'s runs (repeatable)",
        )
    b.add_argument("--workload", default="tiny-cpu")
    b.add_argument("--pairs", type=int, default=5, help="pairs per measurement (default 5)")
    b.add_argument("--steps", type=int, help="steady steps per repeat (default: the workload's)")
    b.add_argument("--alpha", type=float, default=0.05)
    b.add_argument("--min-effect", type=float, help="default: the workload's")
    b.add_argument("--json", action="store_true", help="also print every step as JSON")
    b.add_argument("--store", help="where scratch environments go (the bench store)")
