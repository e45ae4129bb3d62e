"""Our drafter's training step against vLLM speculators' DFlash, side by side on CPU.

    python bench/peer_step.py [--repeats 10] [--steps 10] [--json OUT]     (`just bench-peer`)

One training step = forward + loss + backward + optimizer, at identical tiny shapes: one
packed row (speculators trains batch size 1), the same documents, target features,
initial weights, anchors per row, block size, loss-decay gamma and AdamW settings; SDPA
attention with a dense mask on both sides; one intra-op thread each.

  ours         `dflash.bench.workload_setup.build(workload)` (the trainer's build_run),
               then per step `dflash.step.train_step(run, i, batches=[FeatureBatch])`:
               anchors, DraftStep forward + chunked CE, backward, clip, AdamW, schedule.
  speculators  speculators==0.9.0 in its own venv (built with uv from uv's cache, keyed
               by the pins, tests/isolated_env.py), driven through its public API by
               bench/peer_speculators.py, which also lists its CPU pitfalls.

Repeats are fresh processes, interleaved in pairs whose order alternates (ours first,
then speculators first, ...), so drift of the shared machine's load hits both sides.
A repeat's sample is the median CPU time of its steady steps (single-threaded, so the
CPU clock does not count time the process spent descheduled). The ratio is
ours / speculators per pair; its median and the binomial order-statistic interval of the
median of the paired log ratios come from dflash.bench.stats.median_interval_achieved.
The last line printed is the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Module level: the standard library only. bench/peer_speculators.py imports this file's
# helpers in speculators' venv, where dflash (and scipy) are absent.
REPO = Path(__file__).resolve().parents[1]
PEER_SCRIPT = REPO / "bench" / "peer_speculators.py"
# torch pinned to ours (2.10.0, already in uv's cache from the project sync) so both
# sides run the same kernels; speculators 0.9.0 allows torch 2.9.0 ... 2.14.1, and
# torchvision/torchaudio are its declared dependencies, pinned to that torch's releases.
PEER_PINS = (
    "speculators==0.9.0",
    "torch==2.10.0",
    "torchvision==0.25.0",
    "torchaudio==2.10.0",
    "transformers==5.19.0",
)
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Shapes:
    """What one step computes; the defaults are the tiny-cpu bench workload's drafter."""

    seq_len: int = 512
    max_anchors: int = 32
    block_size: int = 8
    draft_layers: int = 2
    min_doc_len: int = 32
    max_doc_len: int = 192
    vocab: int = 0  # target vocabulary; 0: the tiny tokenizer's, padded to 384 rows

    def __post_init__(self) -> None:
        if self.vocab < 0:
            raise ValueError("--vocab must be >= 0 (0: the tiny tokenizer's, padded)")
        for name in ("seq_len", "max_anchors", "draft_layers", "min_doc_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.block_size < 2:
            raise ValueError("--block-size must be >= 2")
        # speculators gathers the verifier's logits at anchor + k - 1 only while the
        # blocks are shorter than the row; past that it takes another code path.
        if self.max_anchors * self.block_size >= self.seq_len:
            raise ValueError(
                f"--max-anchors x --block-size ({self.max_anchors * self.block_size}) must be "
                f"below --seq-len ({self.seq_len}): lower the anchors or raise the length"
            )


def workload(shapes: Shapes, threads: int):
    from dflash.bench.workloads import Workload
    from dflash.config import TINY_TARGET

    return Workload(
        name="peer-step",
        device="cpu",
        target={**TINY_TARGET, "vocab_size": shapes.vocab or None},
        draft_layers=shapes.draft_layers,
        seq_len=shapes.seq_len,
        rows=1,  # speculators' DFlash trains one packed row per step
        block_size=shapes.block_size,
        max_anchors=shapes.max_anchors,
        threads=threads,
        attn="sdpa",
        min_doc_len=shapes.min_doc_len,
        max_doc_len=shapes.max_doc_len,
    )


def build_ours(spec: dict, scratch: Path):
    import torch

    from dflash.bench.workload_setup import build

    torch.set_num_threads(spec["threads"])
    return build(workload(Shapes(**spec["shapes"]), spec["threads"]), str(scratch / "ours"))


def prepare(spec: dict, scratch: Path) -> None:
    """inputs.pt and spec.json, read by both sides' workers."""
    import torch

    run = build_ours(spec, scratch)
    b = next(run.stream)
    with torch.no_grad():
        feats = run.target(b.input_ids, b.positions, b.doc_ids)
    hidden = run.drafter.config.hidden_size
    gen = torch.Generator().manual_seed(spec["seed"])
    inputs = {
        "input_ids": b.input_ids,
        "loss_mask": b.loss_mask,
        "doc_ids": b.doc_ids,
        "positions": b.positions,
        "feats": feats,
        # speculators' CE labels are the argmax of the verifier's logits at the previous
        # position, from its last hidden state: a random one costs the same as a real one.
        "last_hidden": torch.randn(1, b.input_ids.shape[1], hidden, generator=gen),
        "verifier_norm": torch.ones(hidden),
        "drafter": run.drafter.state_dict(),
        "embed": run.target.embed_tokens.weight.detach(),
        "lm_head": run.target.lm_head.weight.detach(),
    }
    torch.save(inputs, scratch / "inputs.pt")
    keep = (
        *("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"),
        *("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act"),
        *("max_position_embeddings", "rms_norm_eps", "rope_parameters", "attention_bias"),
    )
    d = run.drafter.config.to_dict()
    spec = {
        **spec,
        "drafter_config": {k: d[k] for k in keep},
        "mask_token_id": run.drafter.mask_token_id,
        "target_layer_ids": run.drafter.target_layer_ids,
        "gamma": run.cfg.gamma,
        "lr": run.cfg.lr,
        "weight_decay": run.cfg.weight_decay,
        "grad_clip": run.cfg.grad_clip,
        "n_tokens": b.n_tokens,
    }
    (scratch / "spec.json").write_text(json.dumps(spec, indent=1))


def worker_ours(scratch: Path, out: Path, profile: str | None = None) -> None:
    """One repeat of our step (a fresh process of the project's interpreter)."""
    t0 = time.perf_counter()
    import torch

    # transformers' import (seconds) belongs to "import", as in speculators' worker.
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    from dflash.data.packing import PackedBatch
    from dflash.step import FeatureBatch, train_step

    spec = json.loads((scratch / "spec.json").read_text())
    t_import = time.perf_counter()
    inputs = torch.load(scratch / "inputs.pt", weights_only=True)
    run = build_ours(spec, scratch)
    run.drafter.load_state_dict(inputs["drafter"])
    run.drafter.train()
    n = spec["n_tokens"]
    batch = PackedBatch(
        inputs["input_ids"], inputs["loss_mask"], inputs["doc_ids"], inputs["positions"], 0, n
    )
    trainable = sum(p.numel() for p in run.drafter.parameters() if p.requires_grad)
    t_build = time.perf_counter()
    rss_build = peak_rss_mib()
    marks: dict[str, float] = {}  # CPU clock at the end of each of train_step's stages

    def mark(stage: str) -> None:
        marks[stage] = time.process_time()

    def one_step(i: int) -> dict:
        marks.clear()
        w0, c0 = time.perf_counter(), time.process_time()
        res = train_step(run, i, [FeatureBatch(i, batch, inputs["feats"], n)], mark=mark)
        c_end = time.process_time()
        loss = float(res.loss.detach())
        if not math.isfinite(loss):
            raise RuntimeError(f"our step {i}: loss is not finite ({loss})")
        stages = {
            "forward": marks["drafter_fwd"] - c0,  # anchors, mask, drafter, loss
            "backward": marks["drafter_bwd"] - marks["drafter_fwd"],
            "optimizer": c_end - marks["drafter_bwd"],  # clip, AdamW, schedule, zero_grad
        }
        return {"wall_s": time.perf_counter() - w0, "cpu_s": c_end - c0,
                "stages_cpu_s": stages, "loss": loss}  # fmt: skip

    warmup = [one_step(i) for i in range(spec["warmup"])]
    with profiled(profile):
        steps = [one_step(i) for i in range(spec["warmup"], spec["warmup"] + spec["steps"])]
    result = {
        "side": "ours",
        "torch": torch.__version__,
        "trainable_params": trainable,
        "import_s": t_import - t0,
        "build_s": t_build - t_import,
        "rss_after_build_mib": rss_build,
        "peak_rss_mib": peak_rss_mib(),
        "warmup": warmup,
        "steps": steps,
    }
    out.write_text(json.dumps(result, indent=1))


@contextlib.contextmanager
def profiled(path: str | None):
    """torch.profiler over the block, its op table (by self CPU time) written to `path`."""
    if not path:
        yield
        return
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield
    Path(path).write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def peer_python() -> Path:
    """speculators' interpreter: a venv built once per pin set, then reused."""
    sys.path.insert(0, str(REPO / "tests"))
    from isolated_env import isolated_python

    return isolated_python("speculators-0.9.0", list(PEER_PINS))


def run_worker(
    side: str, python: Path, scratch: Path, index: int, profile: Path | None = None
) -> dict:
    out = scratch / f"{side}-{index}.json"
    extra = [str(profile)] if profile else []
    if side == "ours":
        me = str(Path(__file__).resolve())
        cmd = [sys.executable, me, "--worker", str(scratch), str(out), *extra]
        env = dict(os.environ)
    else:
        cmd = [str(python), "-I", str(PEER_SCRIPT), str(scratch), str(out), *extra]
        # Nothing of the project's environment may leak into theirs.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        tail = proc.stderr[-4000:]
        raise RuntimeError(f"{side} repeat {index} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out.read_text())


def median(values: list[float]) -> float:
    from scipy import stats

    return float(stats.scoreatpercentile(values, 50))


def step_median(result: dict, key: str) -> float:
    return median([s[key] for s in result["steps"]])


def summarise(pairs: list[tuple[dict, dict]], key: str) -> dict:
    """Ratio ours / theirs of per-repeat medians of `key`, with the median's interval."""
    from scipy import stats

    from dflash.bench.stats import median_interval_achieved

    ours = [step_median(o, key) for o, _ in pairs]
    theirs = [step_median(t, key) for _, t in pairs]
    logs = [math.log(a / b) for a, b in zip(ours, theirs, strict=True)]
    lo, hi, achieved = median_interval_achieved(logs, CONFIDENCE)
    p = float(stats.wilcoxon(logs).pvalue) if any(logs) else 1.0
    return {
        "ours_s": median(ours),
        "theirs_s": median(theirs),
        "ratio": math.exp(median(logs)),
        "ci": [math.exp(lo), math.exp(hi)],
        "confidence": achieved,
        "p_two_sided": p,
        "ratios": [math.exp(v) for v in logs],
    }


def stage_medians(results: list[dict]) -> dict[str, float]:
    names = results[0]["steps"][0]["stages_cpu_s"]
    return {k: median([s["stages_cpu_s"][k] for r in results for s in r["steps"]]) for k in names}


def run_pairs(a, python: Path, spec: dict) -> tuple[list[tuple[dict, dict]], dict]:
    with tempfile.TemporaryDirectory(prefix="dflash-peer-") as tmp:
        scratch = Path(tmp)
        prepare(spec, scratch)
        pairs = []
        for r in range(a.repeats):
            order = ("ours", "speculators") if r % 2 == 0 else ("speculators", "ours")
            got = {side: run_worker(side, python, scratch, r) for side in order}
            o, t = got["ours"], got["speculators"]
            pairs.append((o, t))
            print(
                f"pair {r + 1}/{a.repeats} ({order[0]} first): step CPU ms ours "
                f"{1e3 * step_median(o, 'cpu_s'):.1f}, speculators "
                f"{1e3 * step_median(t, 'cpu_s'):.1f}",
                flush=True,
            )
        if a.profile:  # after the timed pairs: the profiler's overhead touches no sample
            a.profile.mkdir(parents=True, exist_ok=True)
            for side in ("ours", "speculators"):
                run_worker(side, python, scratch, a.repeats, a.profile / f"{side}.txt")
            print(f"torch.profiler tables: {a.profile}/ours.txt, {a.profile}/speculators.txt")
        return pairs, json.loads((scratch / "spec.json").read_text())


def print_report(rep: dict) -> None:
    cpu, wall, rss, stages = rep["cpu"], rep["wall"], rep["rss_mib"], rep["stages_cpu_s"]
    lb, la = rep["loadavg_before"][0], rep["loadavg_after"][0]
    print(
        f"\nshapes: {rep['shapes']}, {rep['trainable_params']} trainable parameters, "
        f"torch {rep['torch']['ours']} both; load average {lb:.2f} -> {la:.2f}"
    )
    cols = ("step CPU ms", "fwd", "bwd", "opt", "step wall ms", "peak RSS MiB", "RSS growth")
    print(f"{'':12}" + "".join(f"{c:>14}" for c in cols))
    for side, key in (("ours", "ours_s"), ("speculators", "theirs_s")):
        st = stages[side]
        growth = rss[side]["peak_rss_mib"] - rss[side]["rss_after_build_mib"]
        vals = (
            *(1e3 * cpu[key], 1e3 * st["forward"], 1e3 * st["backward"]),
            *(1e3 * st["optimizer"], 1e3 * wall[key], rss[side]["peak_rss_mib"], growth),
        )
        print(f"{side:12}" + "".join(f"{v:14.1f}" for v in vals))
    print(
        f"wall-time ratio ours/speculators: {wall['ratio']:.3f} "
        f"[{wall['ci'][0]:.3f}, {wall['ci'][1]:.3f}]"
    )
    print(
        f"step time ratio ours/speculators (CPU s, {rep['repeats']} pairs): {cpu['ratio']:.3f} "
        f"[{cpu['ci'][0]:.3f}, {cpu['ci'][1]:.3f}] ({100 * cpu['confidence']:.1f}% interval, "
        f"Wilcoxon p={cpu['p_two_sided']:.3g})"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10, help="fresh processes per side")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per repeat")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per side")
    ap.add_argument("--seed", type=int, default=0)
    for f, default in asdict(Shapes()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=int, default=default)
    ap.add_argument("--json", type=Path, help="write every repeat's numbers here")
    ap.add_argument(
        "--profile", type=Path, help="after the pairs, one torch.profiler repeat per side into DIR"
    )
    ap.add_argument("--worker", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:  # SCRATCH OUT [PROFILE]: one repeat of our side (run by run_worker)
        worker_ours(Path(a.worker[0]), Path(a.worker[1]), *a.worker[2:3])
        return 0
    if a.repeats < 2 or a.steps < 1 or a.warmup < 1 or a.threads < 1:
        ap.error("need --repeats >= 2 (paired ratio), --steps >= 1, --warmup >= 1, --threads >= 1")
    try:
        shapes = Shapes(**{f: getattr(a, f) for f in asdict(Shapes())})
    except ValueError as e:
        ap.error(str(e))

    t0 = time.perf_counter()
    python = peer_python()
    print(f"peer env: {python} ({time.perf_counter() - t0:.1f} s)", flush=True)
    load_before = os.getloadavg()
    spec = {"shapes": asdict(shapes), "threads": a.threads, "seed": a.seed}
    spec.update({"steps": a.steps, "warmup": a.warmup})
    pairs, spec = run_pairs(a, python, spec)
    o0, t0_ = pairs[0]
    if o0["trainable_params"] != t0_["trainable_params"]:
        raise RuntimeError(
            f"the sides train different models: {o0['trainable_params']} vs "
            f"{t0_['trainable_params']} parameters"
        )
    sides = {"ours": [o for o, _ in pairs], "speculators": [t for _, t in pairs]}
    keys = ("peak_rss_mib", "rss_after_build_mib")
    report = {
        "shapes": asdict(shapes),
        "tokens_per_step": spec["n_tokens"],
        "queries_per_step": shapes.max_anchors * shapes.block_size,
        "trainable_params": o0["trainable_params"],
        "torch": {"ours": o0["torch"], "speculators": t0_["torch"]},
        "peer_pins": list(PEER_PINS),
        "repeats": a.repeats,
        "steps": a.steps,
        "threads": a.threads,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu": summarise(pairs, "cpu_s"),
        "wall": summarise(pairs, "wall_s"),
        "stages_cpu_s": {side: stage_medians(rs) for side, rs in sides.items()},
        "rss_mib": {
            side: {k: median([r[k] for r in rs]) for k in keys} for side, rs in sides.items()
        },
        "pairs": [{"ours": o, "speculators": t} for o, t in pairs],
    }
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
