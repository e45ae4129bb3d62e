"""The pipeline's wire format (dflash/distributed/p2p.py): one message per batch, the
metadata then the features, packed and read back without a copy. The transfer itself is
tested by the real torchrun jobs in test_pipeline.py, and the receiver's refills, posted
by its helper thread on CPU, by two real gloo processes here."""

from __future__ import annotations

import os

import pytest
import torch

from dflash.data.packing import PackedBatch
from dflash.distributed.p2p import HEADER, Wire, pack_meta, unpack_meta
from dflash.distributed.telemetry import COUNTERS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, seq, feat_dim", [(2, 5, 3), (1, 7, 6)])
def test_one_message_holds_the_metadata_then_the_features(dtype, rows, seq, feat_dim):
    wire = Wire(rows, seq, feat_dim, dtype)
    message = wire.empty("cpu")
    meta_bytes = (HEADER + 4 * rows * seq) * 8
    offset = wire.feat_offset
    assert meta_bytes <= offset < meta_bytes + 256 and offset % 256 == 0
    assert message.numel() == offset + rows * seq * feat_dim * dtype.itemsize
    meta, feats = wire.split(message)
    assert meta.numel() == HEADER + 4 * rows * seq and meta.data_ptr() == message.data_ptr()
    assert feats.shape == (rows, seq, feat_dim) and feats.dtype == dtype
    assert feats.data_ptr() - message.data_ptr() == offset  # as aligned as a tensor of its own
    g = torch.Generator().manual_seed(0)
    batch = PackedBatch(
        input_ids=torch.randint(0, 1000, (rows, seq), generator=g),
        loss_mask=torch.rand(rows, seq, generator=g) > 0.5,
        doc_ids=torch.randint(-1, 3, (rows, seq), generator=g),
        positions=torch.randint(0, seq, (rows, seq), generator=g),
        n_docs=3,
        n_tokens=rows * seq - 1,
    )
    counters = list(range(10, 10 + len(COUNTERS)))
    assert pack_meta(batch, 42, counters, meta) is meta  # written in place, into the message
    want = torch.randn(rows, seq, feat_dim, generator=g).to(dtype)
    feats.copy_(want)  # the target's forward writes here (TargetFeatures(out=...))
    # What the drafter reads back from a received copy of the bytes.
    header, ids, mask, docs, pos = unpack_meta(wire.split(message.clone())[0], rows, seq)
    assert header.tolist() == [42, rows * seq - 1, 3, *counters]
    for got, ref in ((ids, batch.input_ids), (mask, batch.loss_mask), (docs, batch.doc_ids)):
        assert torch.equal(got, ref)
    assert torch.equal(pos, batch.positions)
    assert torch.equal(wire.split(message.clone())[1], want)


def _link(rank: int, path: str, n: int, depth: int, die_after: int | None) -> None:
    """Rank 1 (target 0) sends n batches to rank 0 (drafter 0), each message filled with
    its batch index; rank 0 receives them through the Receiver and checks them."""
    import threading

    import torch.distributed as dist

    from dflash.distributed.p2p import PeerError, Receiver, Sender
    from dflash.distributed.roles import Layout
    from dflash.distributed.telemetry import Clock

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    layout, wire = Layout(targets=1, drafters=1, accum=1), Wire(2, 3, 4, torch.float32)
    if rank == 1:
        send = Sender(layout, rank, depth, timeout=60, clock=Clock())
        for g in range(n if die_after is None else die_after):
            send.send(0, g, torch.full((wire.nbytes,), g % 256, dtype=torch.uint8))
        send.flush()
        if die_after is not None:
            os._exit(0)  # a dead peer: no destroy, the socket closes mid-schedule
    else:
        batches = ((g, 0) for g in range(n))
        recv = Receiver(layout, 0, batches, depth, wire, torch.device("cpu"), 60, Clock())
        try:
            for g in range(n):
                got = recv.get()
                assert got is not None and got[0] == g
                meta = got[2]
                assert meta.view(torch.uint8).eq(g % 256).all(), g  # its own bytes
                names = [t.name for t in threading.enumerate()]
                assert any(x.startswith("dflash-recv-post") for x in names), names
        except PeerError as e:
            assert die_after is not None and "rank 1 (target 0)" in str(e), e
            os._exit(3)  # the expected failure, named; skip the group's teardown
        assert die_after is None
        assert recv.get() is None and recv.poster is None  # the helper stopped at the end
    dist.destroy_process_group()


@pytest.mark.parametrize("depth", [1, 3])
def test_batches_arrive_in_order_with_the_refills_posted_off_the_training_thread(tmp_path, depth):
    """Real gloo processes: every batch, in order, through the helper thread's refills."""
    import torch.multiprocessing as mp

    args = (str(tmp_path / "store"), 40, depth, None)
    mp.start_processes(_link, args=args, nprocs=2, start_method="spawn")


def test_a_sender_that_dies_fails_the_receive_naming_it(tmp_path):
    import torch.multiprocessing as mp

    args = (str(tmp_path / "store"), 40, 2, 5)  # the sender exits after 5 of 40 batches
    with pytest.raises(mp.ProcessExitedException) as e:
        mp.start_processes(_link, args=args, nprocs=2, start_method="spawn")
    assert (e.value.error_index, e.value.exit_code) == (0, 3)  # the receiver, as expected
