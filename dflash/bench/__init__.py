"""Throughput benchmark harness: workloads, records, baselines, comparison, history.

`dflash bench run` measures a named workload (dflash.bench.workloads) in separate
repeat processes, writes one immutable record per run to the store
(dflash.bench.store), and compares it with the accepted baseline of its
(hardware, workload, CUDA variant) key (dflash.bench.compare), naming what changed
in the environment (dflash.bench.envdiff). See docs/bench.md.
"""
