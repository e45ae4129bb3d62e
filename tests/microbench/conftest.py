"""Micro-benchmarks (pytest-benchmark). Not part of the default `pytest` run: their
files are named bench_*.py, which the default collection (test_*.py) skips.
Run with `just bench-micro` (JSON written to bench/results/micro/)."""

import torch

torch.set_num_threads(1)  # one core each: comparable across runs on shared machines
