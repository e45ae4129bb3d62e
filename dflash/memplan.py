"""Memory plan of one drafter training step at a config's real shapes, without a GPU.

`plan(cfg)` runs the real step (DraftStep over the drafter and the target's frozen
embedding and LM head, loss, backward, then AdamW) on FakeTensors: shapes, dtypes and
autograd are real, no byte is allocated, so Qwen3-8B shapes plan in seconds on a laptop.
A dispatch mode counts the bytes of every live tensor storage after each op; the peak of
that count is what a step holds at its worst moment.

How it stands for a GPU run (what `dflash train` does on CUDA): the frozen target in bf16,
fp32 drafter master weights under bf16 autocast (CPU autocast here: it casts the ops this
step runs, linear/matmul/sdpa, as CUDA's does; RMSNorm and CE upcast in our code), the
GPU's attention (flex unless --attn says otherwise). Not counted: the CUDA context, kernel
workspaces, allocator rounding and fragmentation, and torch.compile's different choice of
saved tensors; leave a few GiB of headroom. tests/test_memplan.py checks the count against
torch.profiler's record of real CPU allocations at tiny shapes.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dflash.config import TrainConfig

GIB = 2**30
GPUS_GIB = (80, 141)  # the GPU sizes users rent (H100/A100 80 GB, H200 141 GB)
# Targets planned without a local directory: `--target Qwen/Qwen3-8B`.
PUBLISHED = {"Qwen/Qwen3-8B": "QWEN3_8B_TARGET"}


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages alive now, and their peak. (torch's own MemTracker
    registers grad hooks on every parameter of a called module and fails on the frozen
    embedding and LM head, hence this small counter.)"""

    supports_higher_order_operators = True  # flex_attention and its backward pass through

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._ids: set[int] = set()

    def track(self, *tensors) -> None:
        for t in tree_flatten(tensors)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()  # views share it: counted once
            if id(st) in self._ids:
                continue
            self._ids.add(id(st))
            self.live += st.nbytes()
            # Storages keep their Python object while alive: its finalizer is the free.
            weakref.finalize(st, self._free, id(st), st.nbytes())
        self.peak = max(self.peak, self.live)

    def _free(self, key: int, nbytes: int) -> None:
        self._ids.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.track(out)
        return out


@dataclass
class MemoryPlan:
    title: str
    weights: int  # drafter parameters, fp32 master weights
    frozen: int  # the target's embedding + LM head (every drafter needs them)
    optimizer: int  # AdamW exp_avg + exp_avg_sq (+ step counters)
    trunk: int  # the target layers a single-process run also holds (not a pipeline drafter)
    target_peak: int  # the target's feature pass (no grad) above resident + trunk
    loss_chunk: int
    step_peak: int  # forward + loss + backward peak above the resident state, --loss-chunk
    step_peak_one_chunk: int  # the same with the loss in one chunk
    grads: int  # fp32 gradients: alive at the end of backward (inside step_peak)
    opt_peak: int  # optimizer step's transient above the resident state (gradients included)
    block_tokens: int  # rows * anchors * block size: the logits' rows
    notes: tuple[str, ...] = ()

    @property
    def resident(self) -> int:
        return self.weights + self.frozen + self.optimizer

    def total(self, chunked: bool = True, single: bool = True) -> int:
        step = self.step_peak if chunked else self.step_peak_one_chunk
        if not single:
            return self.resident + max(step, self.opt_peak)
        return self.resident + self.trunk + max(step, self.opt_peak, self.target_peak)

    def table(self) -> str:
        unit, name = (GIB, "GiB") if self.total() >= GIB else (2**20, "MiB")  # tiny plans
        g = lambda b: f"{b / unit:8.2f}"  # noqa: E731
        rows = [
            ("drafter weights (fp32 master)", self.weights),
            ("target embedding + LM head (frozen)", self.frozen),
            ("AdamW state (fp32 exp_avg, exp_avg_sq)", self.optimizer),
            ("target layers (single process only)", self.trunk),
            ("target feature pass (single process, SDPA)", self.target_peak),
            (f"step peak, --loss-chunk {self.loss_chunk}", self.step_peak),
            (f"step peak, one chunk ({self.block_tokens} rows)", self.step_peak_one_chunk),
            ("  of which fp32 gradients", self.grads),
            ("optimizer step transient", self.opt_peak),
        ]
        out = [self.title, f"{'':44}{name:>8}"]
        out += [f"{name:44}{g(b)}" for name, b in rows]
        fits = lambda b: " ".join(f"{'fits' if b <= n * GIB else 'OVER'} {n}" for n in GPUS_GIB)  # noqa: E731
        for single in (True, False):
            for chunked in (True, False):
                who = "single process" if single else "pipeline drafter"
                how = f"chunk {self.loss_chunk}" if chunked else "one chunk"
                b = self.total(chunked, single)
                out.append(f"{f'total, {who}, {how}':44}{g(b)}   {fits(b)}")
        return "\n".join(out + [f"note: {n}" for n in self.notes])


def target_config(cfg: TrainConfig):
    """The target's shapes: --target's config.json (no weights needed), a published
    config by name, or the tiny preset's target."""
    from transformers import AutoConfig, Qwen3Config

    if cfg.target and (Path(cfg.target) / "config.json").is_file():
        return AutoConfig.from_pretrained(cfg.target, local_files_only=True)
    if cfg.target in PUBLISHED:
        from dflash.bench import workloads

        fields = getattr(workloads, PUBLISHED[cfg.target])
        return Qwen3Config(tie_word_embeddings=False, **fields)
    if not cfg.target:
        from dflash.components import tiny_target_config
        from dflash.data.tokenizer import build_tiny_tokenizer

        return tiny_target_config(len(build_tiny_tokenizer()))
    raise ValueError(
        f"--plan reads the target's shapes from {cfg.target}/config.json, which does not "
        f"exist; copy the model's config.json there (no weights needed) or pass one of "
        f"{sorted(PUBLISHED)}"
    )


@contextmanager
def _flex_for_planning():
    """flex_attention as the GPU runs it: its fused kernel (FakeTensor's rule: outputs and
    logsumexp, never the scores matrix), not eager's compile-and-materialise wrapper."""
    import torch.nn.attention.flex_attention as fa

    debug = fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG

    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        yield
    finally:
        fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = debug


def measure(cfg: TrainConfig, tcfg, *, gpu: bool = True, fake: bool = True, loss_chunk=None):
    """Byte counts of two training steps (the second has AdamW state, as every later one
    does): resident before it, its forward+backward peak, the live bytes after backward,
    the optimizer step's peak. `gpu`: bf16 target and autocast, flex by default; else
    what a CPU run does (fp32, sdpa). `fake=False` allocates for real (tests, tiny)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dflash.anchors import sample_anchors
    from dflash.data.random_stream import RandomStream
    from dflash.draft_step import DraftStep
    from dflash.model import DFlashDraftModel, make_draft_config
    from dflash.target import target_layer_ids

    dtype = torch.bfloat16 if gpu else torch.float32
    attn = cfg.attn if cfg.attn != "auto" else ("flex" if gpu else "sdpa")
    ids = target_layer_ids(tcfg.num_hidden_layers, cfg.num_target_features)
    h, vocab = tcfg.hidden_size, tcfg.vocab_size
    # The mask row's id does not change a byte; the last row is always inside the embedding.
    mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else vocab - 1
    dcfg = make_draft_config(
        tcfg,
        num_layers=cfg.draft_layers,
        block_size=cfg.block_size,
        mask_token_id=mask_id,
        target_layer_ids=ids,
    )
    host = next(
        RandomStream(
            vocab_size=vocab - 1,
            seq_len=cfg.seq_len,
            rows=cfg.rows,
            seed=cfg.seed,
            min_doc_len=cfg.min_doc_len,
            max_doc_len=cfg.max_doc_len,
        )
    )
    mode = FakeTensorMode() if fake else None
    live = LiveBytes()
    with mode or _null(), _flex_for_planning() if attn == "flex" else _null():
        drafter = DFlashDraftModel(dcfg)  # fp32, as build_drafter makes it
        embed = torch.nn.Embedding(vocab, h, dtype=dtype).requires_grad_(False)
        head = torch.nn.Linear(h, vocab, bias=False, dtype=dtype).requires_grad_(False)
        if getattr(tcfg, "tie_word_embeddings", False):
            head.weight = embed.weight
        step_fn = DraftStep(
            drafter,
            embed,
            head,
            gamma=cfg.gamma,
            loss_chunk=loss_chunk or cfg.loss_chunk,
            attn=attn,
        )
        # The trainer's optimizer; foreach, as torch picks on CUDA (its temporaries count).
        opt = torch.optim.AdamW(
            drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=gpu
        )
        as_input = mode.from_tensor if mode is not None else (lambda t: t)
        batch = dataclasses.replace(
            host,
            input_ids=as_input(host.input_ids),
            loss_mask=as_input(host.loss_mask),
            doc_ids=as_input(host.doc_ids),
            positions=as_input(host.positions),
        )
        live.track(
            list(step_fn.parameters()),
            list(step_fn.buffers()),
            batch.input_ids,
            batch.loss_mask,
            batch.doc_ids,
            batch.positions,
        )
        out: dict[str, Any] = {}
        with live:
            for _ in range(2):
                out["resident"] = live.peak = live.live
                # The target's features arrive in its dtype: part of the step's memory.
                feats = torch.randn(cfg.rows, cfg.seq_len, len(ids) * h, dtype=dtype)
                anchors, valid = sample_anchors(
                    batch.loss_mask, batch.doc_ids, cfg.block_size, cfg.max_anchors
                )
                autocast = torch.autocast("cpu", dtype=torch.bfloat16) if gpu else _null()
                with autocast:
                    loss, _stats = step_fn(batch, feats, anchors, valid)
                loss.backward()
                del loss, _stats, feats, anchors, valid
                out["step_peak"], out["after_backward"] = live.peak, live.live
                live.peak = live.live
                opt.step()
                opt.zero_grad(set_to_none=True)
                out["opt_peak"] = live.peak
        out["attn"] = attn
        out["weights"] = sum(p.nbytes for p in drafter.parameters())
        out["frozen"] = sum(p.nbytes for p in {embed.weight, head.weight})
        out["optimizer"] = sum(
            t.nbytes for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)
        )
    return out


@contextmanager
def _null():
    yield


def measure_target(cfg: TrainConfig, tcfg) -> tuple[int, int]:
    """(bytes of the target layers TargetFeatures keeps beyond embedding and LM head,
    its feature pass's peak above them) on FakeTensors, bf16, HF's SDPA attention. In a
    single process this pass runs before the drafter step, never during it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    from dflash.data.random_stream import RandomStream
    from dflash.target import TargetFeatures, target_layer_ids

    host = next(
        RandomStream(
            vocab_size=tcfg.vocab_size - 1,
            seq_len=cfg.seq_len,
            rows=cfg.rows,
            seed=cfg.seed,
            min_doc_len=cfg.min_doc_len,
            max_doc_len=cfg.max_doc_len,
        )
    )
    tcfg = copy.deepcopy(tcfg)  # the caller's config keeps its attention setting
    tcfg._attn_implementation = "sdpa"
    mode, live = FakeTensorMode(), LiveBytes()
    with mode:
        model = AutoModelForCausalLM.from_config(tcfg, dtype=torch.bfloat16)
        target = TargetFeatures(
            model, target_layer_ids(tcfg.num_hidden_layers, cfg.num_target_features)
        )
        live.track(list(target.parameters()), list(target.buffers()))
        layers = sum(p.nbytes for p in target.layers.parameters())
        args = [mode.from_tensor(t) for t in (host.input_ids, host.positions, host.doc_ids)]
        base = live.peak = live.live
        with live:
            target(*args)
    return layers, live.peak - base


def plan(cfg: TrainConfig, tcfg=None) -> MemoryPlan:
    """The memory of one training step of `cfg` on a GPU (see the module doc)."""
    tcfg = tcfg if tcfg is not None else target_config(cfg)
    block_tokens = cfg.rows * cfg.max_anchors * cfg.block_size
    chunked = measure(cfg, tcfg)
    one = measure(cfg, tcfg, loss_chunk=max(block_tokens, cfg.loss_chunk))
    res = chunked["resident"]
    trunk, target_peak = measure_target(cfg, tcfg)
    title = (
        f"memory plan, one GPU step: preset {cfg.preset}, target {cfg.target or 'tiny'} "
        f"(hidden {tcfg.hidden_size}, vocab {tcfg.vocab_size}), {cfg.draft_layers} drafter "
        f"layers, {cfg.rows} row(s) x {cfg.seq_len} tokens, {cfg.max_anchors} anchors x "
        f"block {cfg.block_size}, attn {chunked['attn']}, bf16 autocast"
    )
    notes = [
        "not counted: the CUDA context, kernel workspaces, allocator rounding and "
        "fragmentation, torch.compile's own choice of saved tensors; keep a few GiB free",
        {
            "flex": "flex: counted as its fused kernel (output + logsumexp, never the scores)",
            "sdpa": "sdpa: counted with the CPU kernel (it keeps output + logsumexp); on CUDA "
            "a boolean mask may select the math kernel, which keeps the scores",
        }[chunked["attn"]],
    ]
    return MemoryPlan(
        notes=tuple(notes),
        title=title,
        weights=chunked["weights"],
        frozen=chunked["frozen"],
        optimizer=chunked["optimizer"],
        trunk=trunk,
        target_peak=target_peak,
        loss_chunk=cfg.loss_chunk,
        step_peak=chunked["step_peak"] - res,
        step_peak_one_chunk=one["step_peak"] - res,
        grads=chunked["weights"],
        opt_peak=chunked["opt_peak"] - res,
        block_tokens=block_tokens,
    )
