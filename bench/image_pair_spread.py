"""How much one paired measurement of an image against itself scatters on this host.

`dflash bench run --image` (paired image runs) and `dflash bench bisect IMAGE IMAGE`
measure pairs of containers, back to back (runner.run_pairs). This runs pairs of the
same image on both sides, through the same code, so every pair's ratio should be 1: the
SD of its log is the noise a real change has to beat. It prints that SD for the
verdict's samples and for the reference-corrected ones. `--rounds` repeats the whole
measurement, to see the spread of that SD too.

  .venv/bin/python bench/image_pair_spread.py dflash:cu128 --pairs 5 --rounds 2

It needs the Docker Engine API: the default socket or `$DOCKER_HOST`, as `dflash bench
run --image` does.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from dflash.bench.compare import paired_samples
from dflash.bench.image import docker_client, docker_image_info, engine_address
from dflash.bench.image_env import ImageEnv
from dflash.bench.paired import paired_verdict
from dflash.bench.runner import concurrent_pairs, run_pairs, summarize
from dflash.bench.workloads import get_workload


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("image", help="an image ref or id on the engine's host")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, help="steady steps per repeat (default: the workload's)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workload", default="tiny-cpu")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every repeat")
    args = ap.parse_args()
    if args.pairs < 2:
        ap.error(f"--pairs {args.pairs}: an SD needs at least 2 pairs")
    client = docker_client()
    if client is None:
        sys.exit(f"no Docker Engine API answers at {engine_address()}: set DOCKER_HOST")
    try:
        info = docker_image_info(client, args.image)
    except Exception as exc:  # noqa: BLE001 - docker.errors.ImageNotFound and kin
        sys.exit(f"image {args.image}: {exc} (`just build cu128` makes dflash:cu128)")
    w = get_workload(args.workload)
    if args.steps:
        w = w.with_changes(steps=args.steps)
    a = ImageEnv(info, "candidate", "docker-api", False, client)
    b = ImageEnv(info, "baseline", "docker-api", False, client)
    why = concurrent_pairs(w, a, b)
    mode = f"back to back ({why})" if why else "concurrent"
    print(f"{args.image} against itself, {w.name}, {w.steps} steps, pairs {mode}")
    for k in range(args.rounds):
        t0 = time.perf_counter()
        cand, base = run_pairs(w, a, b, print if args.verbose else lambda _: None, args.pairs)
        sc, sb = summarize(w, cand), summarize(w, base)
        # The verdict's samples (compare.paired_samples: uncorrected where the workload
        # has a machine-speed reference) and the reference-corrected ones; the per-pair
        # ratios are paired_verdict's own, so this is the spread the verdict sees.
        for name, x, y in (
            ("verdict's samples", paired_samples(sc), paired_samples(sb)),
            ("reference-corrected", sc["samples"], sb["samples"]),
        ):
            ratios = paired_verdict(x, y, 0.05, w.min_effect).ratios
            sd = statistics.stdev(math.log(r) for r in ratios)
            print(
                f"round {k + 1}, {name}: SD of log ratio {sd:.4f}, ratios "
                + " ".join(f"{r:.3f}" for r in ratios)
            )
        print(f"round {k + 1}: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
