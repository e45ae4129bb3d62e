"""Target rank: its share of the global batches -> frozen target -> features -> drafters.

Target t produces global micro-batches g = t, t+T, t+2T, ... (dflash/distributed/roles.py), each
exactly the batch a single process would see as its g-th micro-batch, so the number of
targets never changes what is trained. Control messages from drafter 0 (one per logging
step, "go on" or "stop") keep targets at most `lag` steps ahead of the drafters, so a
stop leaves a known number of batches on the wire, which the drafters drain.
"""

from __future__ import annotations

import time
from collections import deque

import torch
import torch.distributed as dist

from dflash.config import TrainConfig
from dflash.distributed.p2p import Sender, pack_meta, post, unpack_meta, wait, wire_of
from dflash.distributed.roles import Layout
from dflash.distributed.telemetry import Clock
from dflash.run import build_run


def control_steps(cfg: TrainConfig, start_step: int) -> list[int]:
    """Steps after which drafter 0 sends each target a go-on/stop message."""
    return [s for s in range(cfg.log_every, cfg.max_steps, cfg.log_every) if s > start_step]


def control_lag(cfg: TrainConfig) -> int:
    """Targets may run this many steps past the last control message they have read.
    >= max_in_flight so drafters' posted receives never outrun what targets will send."""
    return cfg.log_every + cfg.max_in_flight


class GlobalBatches:
    """Global micro-batch g of the single-process stream (rank 0 of 1), for increasing g.

    Random data is indexable (a pure function of the index). Packed real data is
    sequential: every target packs the whole sequence and keeps its own batches, which
    costs host tokenisation only, small next to the target forward it saves.
    """

    def __init__(self, stream, start: int) -> None:
        self.stream, self.next = stream, start
        self.indexable = hasattr(stream, "batch_at")
        if not self.indexable:
            self.next = 0
            self._skip_to(start)

    def _skip_to(self, g: int) -> None:
        while self.next < g:
            next(self.stream)
            self.next += 1

    def get(self, g: int):
        if self.indexable:
            return self.stream.batch_at(g)[0]
        self._skip_to(g)
        self.next += 1
        return next(self.stream)


def run_target(
    cfg: TrainConfig,
    layout: Layout,
    rank: int,
    device: torch.device,
    start_step: int,
    ctrl_group,
    sim=None,
) -> dict:
    _, t = layout.role(rank)
    cuda = device.type == "cuda"
    run = build_run(cfg, "target", device)
    # simulate.py: a wait sized by the hardware profile stands in for the forward.
    target = run.target if sim is None else sim.target(cfg.rows, cfg.seq_len)
    source = GlobalBatches(run.stream, start_step * layout.per_step)
    rows, seq = cfg.rows, cfg.seq_len
    wire = wire_of(cfg, run, sim)
    clock = Clock()
    sender = Sender(layout, rank, cfg.max_in_flight, cfg.dist_timeout, clock)
    lead = layout.drafter_rank(0)
    pending = deque(control_steps(cfg, start_step))
    lag = control_lag(cfg)
    # Control travels on a gloo group in host memory: reading it is no device sync, and
    # it never queues behind (or ahead of) batch transfers on an NCCL pair stream, where
    # the two directions of a link would otherwise wait on each other.
    ctrl = torch.zeros(1, dtype=torch.int64)

    def read_control() -> bool:
        s = pending.popleft()
        with clock("wait_send"):  # waiting for drafters to catch up is waiting on them
            what = f"control of step {s} from rank {lead}"
            wait(post(dist.irecv, ctrl, lead, what, ctrl_group), cfg.dist_timeout, what, ctrl_group)
        return bool(ctrl.item())

    stopped_at = None
    sent = 0
    for g, d in layout.target_batches(t, start_step, cfg.max_steps):
        step = g // layout.per_step
        while pending and pending[0] + lag < step and stopped_at is None:
            s = pending[0]
            if read_control():
                stopped_at = s
        if stopped_at is not None:
            break
        batch = source.get(g)  # host packing: counted as idle
        with clock("compute"):
            # The batch's one message: metadata, then the features the forward writes.
            message = wire.empty(device)
            meta, feats = wire.split(message)
            if cuda:  # one pinned H2D copy of all metadata; the target reads views of it
                staged = torch.empty(wire.meta_numel, dtype=torch.int64, pin_memory=True)
                meta.copy_(pack_meta(batch, g, clock.counters(), staged), non_blocking=True)
            else:
                pack_meta(batch, g, clock.counters(), meta)
            _, ids, _, docs, pos = unpack_meta(meta, rows, seq)
            target(ids, pos, docs, out=feats)
            if cuda:
                # Charge the forward to compute (not to the send wait) without a full
                # device sync: poll one event.
                done = torch.cuda.Event()
                done.record()
                while not done.query():
                    time.sleep(1e-4)
        clock.in_flight += sender.in_flight()
        clock.n += 1
        clock.tokens += batch.n_tokens
        sender.send(d, g, message)
        sent += 1
    sender.flush()
    while pending and stopped_at is None:  # match every control message drafter 0 sends
        s = pending[0]
        if read_control():
            stopped_at = s
    return {"role": "target", "index": t, "batches": sent, "stopped_at": stopped_at}
