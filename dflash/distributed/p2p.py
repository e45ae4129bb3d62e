"""Point-to-point transport of (metadata, features) from target ranks to drafter ranks.

Wire format of one batch: ONE message, a byte buffer holding, in this order,
  meta  int64 [HEADER + 4*R*S]: header (global batch index, token/doc counts, the
        sender's cumulative telemetry counters), then input_ids, loss_mask, doc_ids,
        positions of the packed [R, S] batch;
  feats [R, S, k*H] target features (bf16 on GPU, fp32 on CPU), from a 256-byte
        boundary, written in place by the target's forward (`out=`), so joining the
        two costs no copy.
One message, not two: every gloo send or receive posted holds the pair's lock across a
socket write, and beside another busy process each post is a chance for gloo's event
loop to spin on that lock (docs/bench.md, "The communication threads beside a tenant").
Shapes are fixed by the config (rows, seq_len), so receivers preallocate their buffers
and nothing about the wire depends on the data.

Every wait is bounded by --dist-timeout and failures name the peer: a dead or hung rank
turns into an error on its neighbours instead of a silent hang.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from dflash.data.packing import PackedBatch
from dflash.distributed.telemetry import COUNTERS, Clock

HEADER = 3 + len(COUNTERS)  # g, n_tokens, n_docs, counters...


class PeerError(RuntimeError):
    """A p2p transfer failed or timed out; the message names the peer rank and role."""


def wait(work, timeout: float, what: str, group=None) -> None:
    """Block until `work` (an op on `group`) is done. gloo: a host wait. NCCL: work.wait()
    would only make the compute stream wait, so poll completion (an event query, not a
    device sync)."""
    try:
        if dist.get_backend(group) == "gloo":
            work.wait(timedelta(seconds=timeout))
            return
        deadline, nap = time.monotonic() + timeout, 1e-5
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no progress for {timeout:.0f}s (--dist-timeout)")
            time.sleep(nap)
            nap = min(nap * 2, 1e-3)
        work.wait()
    except Exception as e:  # gloo raises RuntimeError/DistBackendError on a dead peer
        raise PeerError(f"{what} failed: {type(e).__name__}: {e}") from e


def post(op, tensor: Tensor, peer: int, what: str, group=None):
    """Start an isend/irecv. Posting can fail too (gloo reports a peer's reset connection
    on the next op of the pair): the error then names the peer like a failed wait."""
    try:
        return op(tensor, peer, group=group)
    except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError/DistBackendError
        raise PeerError(f"{what} failed: {type(e).__name__}: {e}") from e


@dataclass(frozen=True)
class Wire:
    """The byte layout of one batch's message; both ends build it from the same config."""

    rows: int
    seq_len: int
    feat_dim: int
    dtype: torch.dtype

    @property
    def meta_numel(self) -> int:
        return HEADER + 4 * self.rows * self.seq_len

    @property
    def feat_offset(self) -> int:
        """Where the features start: the metadata's bytes rounded up to 256, so the
        features are as aligned as a tensor of their own (the CUDA caching allocator
        aligns blocks to 512 bytes): the metadata alone ends 8 bytes past a multiple of
        16, which would leave bf16 features off the 16-byte alignment vectorised
        kernels and cuBLAS prefer."""
        return -(-self.meta_numel * 8 // 256) * 256

    @property
    def nbytes(self) -> int:
        feats = self.rows * self.seq_len * self.feat_dim * self.dtype.itemsize
        return self.feat_offset + feats

    def empty(self, device: torch.device | str) -> Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def split(self, buf: Tensor) -> tuple[Tensor, Tensor]:
        """(meta int64 [meta_numel], feats [R, S, F]): views of one message buffer."""
        cut = self.feat_offset
        feats = buf[cut:].view(self.dtype).view(self.rows, self.seq_len, self.feat_dim)
        return buf[: self.meta_numel * 8].view(torch.int64), feats


def wire_of(cfg, run, sim=None) -> Wire:
    """The wire of a pipeline run: the target's k*H features, or a simulation's width."""
    if sim is not None:
        return Wire(cfg.rows, cfg.seq_len, sim.feat_dim, run.dtype)
    feat_dim = len(run.target.layer_ids) * run.target.hidden_size
    return Wire(cfg.rows, cfg.seq_len, feat_dim, run.dtype)


def pack_meta(batch: PackedBatch, g: int, counters: list[int], out: Tensor) -> Tensor:
    """Write one batch's metadata into `out`, a host int64 [HEADER + 4*R*S] tensor (the
    message's own meta view on CPU, a pinned staging buffer for a GPU). Each field is
    copied once, straight into place: stack + cat + pin_memory made three copies of the
    4*R*S body, a few ms per batch at the real shapes (docs/bench.md, "Pipeline at real
    topologies (simulated)")."""
    rows, seq = batch.input_ids.shape
    out[:HEADER] = torch.tensor([g, batch.n_tokens, batch.n_docs, *counters])
    body = out[HEADER:].view(4, rows, seq)
    for i, t in enumerate((batch.input_ids, batch.loss_mask, batch.doc_ids, batch.positions)):
        body[i].copy_(t)
    return out


def unpack_meta(meta: Tensor, rows: int, seq_len: int) -> tuple[Tensor, ...]:
    """(header, input_ids, loss_mask, doc_ids, positions) as views/ops on the device."""
    body = meta[HEADER:].view(4, rows, seq_len)
    return meta[:HEADER], body[0], body[1].bool(), body[2], body[3]


class Sender:
    """Target side: isend to drafters with at most `depth` batches in flight per link.

    A full link blocks the target (backpressure): that time is "waiting to send".
    """

    def __init__(self, layout, rank: int, depth: int, timeout: float, clock: Clock) -> None:
        self.layout, self.rank, self.depth, self.timeout = layout, rank, depth, timeout
        self.clock = clock
        self.links: dict[int, deque] = {d: deque() for d in range(layout.drafters)}

    def _retire(self, d: int, block: bool) -> None:
        q = self.links[d]
        while q and (block or q[0][0].is_completed()):
            work, g, _ = q.popleft()
            who = self.layout.name(self.layout.drafter_rank(d))
            wait(work, self.timeout, f"sending batch {g} to {who}")
            block = False

    def in_flight(self) -> int:
        """Sends not known to be complete. NCCL reports completion as it happens; gloo only
        when waited on, so there this reads as the send-queue occupancy (<= depth)."""
        for d in self.links:
            self._retire(d, block=False)
        return sum(len(q) for q in self.links.values())

    def send(self, d: int, g: int, message: Tensor) -> None:
        with self.clock("wait_send"):
            while len(self.links[d]) >= self.depth:
                self._retire(d, block=True)
        peer = self.layout.drafter_rank(d)
        what = f"sending batch {g} to {self.layout.name(peer)}"
        work = post(dist.isend, message, peer, what)
        self.links[d].append((work, g, message))  # keep the buffer alive until sent

    def flush(self) -> None:
        with self.clock("wait_send"):
            for d, q in self.links.items():
                while q:
                    self._retire(d, block=True)


class Receiver:
    """Drafter side: irecv posted up to `depth` batches ahead into a ring of preallocated
    buffers, so transfers overlap the training of the previous batch.

    gloo: the refill after each batch is posted from a helper thread, off the training
    thread. Posting takes the pair's lock, which gloo's event-loop thread holds while it
    handles the pair's socket, and writes to that socket: on the training thread it cost
    a 1 + 1 CPU drafter 1-2% of its step, most of it waiting rather than CPU; moved, the
    receive fell from 4.1% to 2.6% of the step (docs/bench.md, "The receive split").
    NCCL posts do not wait on a lock; they stay on the training thread, so each recv is
    still ordered after the stream that used its buffer.
    """

    def __init__(
        self,
        layout,
        d: int,
        schedule: Iterator[tuple[int, int]],  # (g, target) in order
        depth: int,
        wire: Wire,
        device: torch.device,
        timeout: float,
        clock: Clock,
    ) -> None:
        self.layout, self.d, self.schedule, self.depth = layout, d, schedule, depth
        self.timeout, self.clock, self.wire = timeout, clock, wire
        self.current: Tensor | None = None
        # depth posted + 1 being trained on: a buffer is reused only after its batch's
        # backward has been enqueued (NCCL orders the recv after the current stream).
        self.free = [wire.empty(device) for _ in range(depth + 1)]
        self.posted: deque = deque()
        # One helper, so posts stay in schedule order; `get` waits for its last refill
        # before it touches `posted`, `free` or `schedule`, so they are never shared.
        self.poster = ThreadPoolExecutor(1, "dflash-recv-post") if device.type == "cpu" else None
        self.refill: Future | None = None

    def _post(self) -> None:
        while len(self.posted) < self.depth and self.free:
            nxt = next(self.schedule, None)
            if nxt is None:
                return
            g, t = nxt
            message = self.free.pop()
            src = self.layout.target_rank(t)
            what = f"receiving batch {g} from {self.layout.name(src)}"
            self.posted.append((g, t, post(dist.irecv, message, src, what), message))

    def get(self) -> tuple[int, int, Tensor, Tensor] | None:
        """Next (g, target, meta, feats), meta and feats views of the batch's message, or
        None when the schedule is exhausted."""
        if self.refill is not None:
            refill, self.refill = self.refill, None
            refill.result()  # done long ago but for the first batches; raises its PeerError
        if self.current is not None:
            self.free.append(self.current)
            self.current = None
        self._post()
        if not self.posted:
            self.close()
            return None
        g, t, work, message = self.posted.popleft()
        with self.clock("wait_recv"):
            who = self.layout.name(self.layout.target_rank(t))
            wait(work, self.timeout, f"receiving batch {g} from {who}")
        self.current = message
        # refill right away so the next transfer overlaps this batch
        if self.poster is None:
            self._post()
        else:
            self.refill = self.poster.submit(self._post)
        return (g, t, *self.wire.split(message))

    def close(self) -> None:
        """Stop the helper thread (the end of the schedule; a rank that fails exits)."""
        if self.poster is not None:
            self.poster.shutdown(wait=True)
            self.poster = None
