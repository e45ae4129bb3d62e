"""Drafter rank: receive features, sample anchors, train; DDP among drafter ranks only.

Drafter d trains micro-batches [d*A, (d+1)*A) of every optimizer step (roles.py), with
the anchors of batch g seeded from (seed, g) (step.anchor_seed), and DDP averages the
gradients over the D drafters: the step equals a single process's step with
grad_accum = D*A up to float summation order. Drafter 0 writes checkpoints and metrics.
Host-device syncs happen on logging steps only: losses, token counts and the routing
check accumulate on the device in between.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash import checkpoint as ckpt
from dflash.config import TrainConfig
from dflash.data.packing import PackedBatch
from dflash.distributed.p2p import Receiver, post, unpack_meta, wait, wire_of
from dflash.distributed.roles import Layout
from dflash.distributed.target_rank import control_lag, control_steps
from dflash.distributed.telemetry import COUNTERS, Clock, summarize
from dflash.run import StopFlag, build_run, open_logger
from dflash.step import Accumulator, FeatureBatch, nonfinite_error, train_step


def run_drafter(
    cfg: TrainConfig,
    layout: Layout,
    rank: int,
    device: torch.device,
    group,
    ctrl_group,
    start_step: int,
    last: Path | None,
    record: dict[str, Any] | None,
    flag: StopFlag,
    env_record=None,
    sim=None,
) -> dict[str, Any]:
    _, d = layout.role(rank)
    lead = d == 0
    run_dir = Path(cfg.out)
    cuda = device.type == "cuda"
    run = build_run(cfg, "drafter", device)
    drafter = run.drafter
    if last is not None:  # every drafter reads it: RUN must be on a shared filesystem
        run.load_state_dict(ckpt.load_checkpoint(last, drafter.config))
    # Gradients are averaged over the drafter subgroup only; targets never join. A lone
    # drafter has nothing to average: DDP would still copy every gradient into its
    # buckets and back each step (6.6% of a tiny-cpu drafter's step, docs/bench.md).
    model = run.step_fn
    if layout.drafters > 1:
        model = DDP(
            run.step_fn,
            process_group=group,
            device_ids=[device.index] if cuda else None,
            broadcast_buffers=False,
        )

    logger = None
    if lead:
        logger = open_logger(run_dir, cfg, start_step, record, env_record)

    def save(at: int) -> None:
        # The data position is the step: batch g is a function of g (target_rank.py).
        data = {"kind": "pipeline", "next_batch": at * layout.per_step}
        ckpt.save_checkpoint(run_dir, at, run.state_dict(at, data), cfg.keep_last, drafter.config)

    end = [cfg.max_steps]  # exclusive; lowered on a stop to drain what targets sent

    def schedule():
        s = start_step
        while s < end[0]:
            yield from layout.drafter_batches(d, s)
            s += 1

    rows, seq = cfg.rows, cfg.seq_len
    # simulate.py: a profile's wait stands in for the step, and features are narrower.
    step_fn = train_step if sim is None else sim.drafter_step(group)
    clock = Clock()
    recv = Receiver(
        layout, d, schedule(), cfg.max_in_flight, wire_of(cfg, run, sim), device,
        cfg.dist_timeout, clock,
    )  # fmt: skip
    acc = Accumulator(cfg.block_size, device)
    bad_route = torch.zeros((), dtype=torch.bool, device=device)
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    heard = torch.zeros(layout.targets, len(COUNTERS), dtype=torch.int64, device=device)
    prev_tel = torch.zeros(layout.world, len(COUNTERS), dtype=torch.int64)
    ctrl_steps = set(control_steps(cfg, start_step))
    ctrl_works: list = []
    step, saved_at = start_step, (start_step if last is not None else None)
    last_rec: dict[str, Any] = {}
    stop = False
    A = layout.accum

    def arrivals(step: int):
        """This step's micro-batches off the wire, as the step function takes them."""
        for g, t in layout.drafter_batches(d, step):
            got = recv.get()  # its wait is charged to wait_recv inside
            assert got is not None and got[0] == g, (got, g)
            _, _, meta, feats = got
            header, ids, mask, docs, pos = unpack_meta(meta, rows, seq)
            bad_route.logical_or_(header[0] != g)  # checked on the next logging step
            heard[t].copy_(header[3:])  # the target's freshest telemetry
            tokens.add_(header[1])
            # n_docs is not sent: only the data counters of the single process use it.
            yield FeatureBatch(g, PackedBatch(ids, mask, docs, pos, 0, 0), feats, header[1])

    drafter.train()
    while step < cfg.max_steps and not stop:
        with clock("compute"):  # the receive waits inside are subtracted (telemetry.py)
            res = step_fn(run, step, arrivals(step), n_micro=A, model=model, acc=acc)
        grad_norm, lr = res.grad_norm, res.lr
        step += 1
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            want_stop = flag.signum is not None
            # Sync point (logging steps only): sums over drafters, telemetry by MAX.
            votes = torch.stack([bad_route.double(), torch.tensor(float(want_stop), device=device)])
            sums = torch.cat([acc.flat, votes])
            row = torch.tensor(clock.counters(), dtype=torch.int64, device=device)
            row[COUNTERS.index("tokens")] = tokens
            tel = torch.zeros(layout.world, len(COUNTERS), dtype=torch.int64, device=device)
            tel[layout.target_rank(0) : layout.target_rank(0) + layout.targets] = heard
            tel[rank] = row
            # A lone drafter's reductions would return their input: gloo still runs its
            # collective machinery for a group of one, 0.6 ms per logging step on CPU.
            if layout.drafters > 1:
                dist.all_reduce(sums, group=group)
                dist.all_reduce(tel, op=dist.ReduceOp.MAX, group=group)
            acc.flat.copy_(sums[: acc.flat.numel()])
            sums = sums.cpu()
            if sums[-2] > 0:
                raise RuntimeError("a drafter received a batch it was not routed (bug)")
            stop = bool(sums[-1] > 0) and step < cfg.max_steps
            n_logged = step % cfg.log_every or cfg.log_every
            rec = acc.record(step, n_logged, n_ranks=layout.drafters)
            acc.reset()
            if rec.pop("_nonfinite"):
                raise nonfinite_error(step, saved_at)
            tel = tel.cpu()
            pipe = summarize(layout, prev_tel, tel)
            prev_tel = tel
            rec.pop("_tokens")
            if logger is not None:  # the lead drafter
                last_rec = {
                    **rec,
                    "lr": lr,
                    "grad_norm": float(grad_norm),
                    "tok_per_s": pipe["pipe/drafter_tok_per_s"],
                    **pipe,
                }
                print(logger.log(last_rec), flush=True)
                print(f"pipeline step {step}: {pipe['bottleneck']}", flush=True)
            if lead and step in ctrl_steps:
                msg = torch.tensor([int(stop)], dtype=torch.int64)  # host: see target_rank
                for tt in range(layout.targets):
                    peer = layout.target_rank(tt)
                    what = f"control to {layout.name(peer)}"
                    work = post(dist.isend, msg, peer, what, ctrl_group)
                    ctrl_works.append((work, peer, msg))
        if lead and (stop or (cfg.save_every and step % cfg.save_every == 0)):
            save(step)
            saved_at = step
    if stop:  # targets ran at most `lag` steps ahead: receive and drop what they sent
        end[0] = min(step + control_lag(cfg) + 1, cfg.max_steps)
        while recv.get() is not None:
            pass
    for w, peer, _ in ctrl_works:
        wait(w, cfg.dist_timeout, f"control to {layout.name(peer)}", ctrl_group)
    if logger is not None:  # the lead drafter
        if not stop:
            if saved_at != step:
                save(step)
            ckpt.export_drafter(drafter, run_dir)
        logger.close()
    return {"role": "drafter", "index": d, "step": step, "interrupted": stop, "last": last_rec}
