"""Multi-device training: frozen targets and training drafters, one process per device,
connected by torch.distributed point-to-point sends (NCCL on GPU, gloo on CPU).

launch.py     decide single process / this rank / spawn torchrun
rank_cli.py   `python -m dflash.distributed.rank_cli`: one rank without the preflight
roles.py      ranks -> roles, deterministic batch routing (why the loss equals one process's)
p2p.py        wire format, bounded in-flight sends, prefetched receives, bounded waits
target_rank.py, drafter_rank.py   the two loops
telemetry.py  per-rank time accounting and the bottleneck line
pipeline.py   process group, start/resume handshake, fault reporting
"""
