"""One benchmark repeat, in its own process: `dflash bench worker SPEC OUT` (or
`python -m dflash.bench.worker SPEC OUT`), a fresh interpreter of the environment
under test, started by runner.py through envs.py.

Times, separately: imports, building the models, the first step (lazy init and
torch.compile), the remaining warm-up steps, then the steady-state steps that the
comparison uses. Each steady step records its tokens/s and per-stage times:
  data       host: next packed batch
  transfer   host -> device copy
  target     frozen target forward (features)
  anchors    anchor sampling
  drafter_fwd, drafter_bwd, optimizer
  wait       time the host spent waiting for the device at the end of the step
On CPU every stage is synchronous and timed with the host clock, or with the
process's CPU clock when the workload's metric is CPU time (then stage times and
throughput use the same clock, and other tenants' load does not fill the stages).
On CUDA the stages are timed with events (no sync between stages, so the host can
still run ahead within a step) and the step ends with one synchronize, charged to
`wait`.
With a machine-speed reference (CPU workloads on shared hosts, see reference.py) each
steady step is followed, outside its timing, by one reference run on the same clock:
`ref_s`, and `tok_per_ref`, the step's tok/cpu-s corrected by it (reference.corrected).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from dflash.bench.envs import BARRIER_ENV, SPAWN_TIME_ENV
from dflash.bench.reference import Reference, corrected

# Variables that change CPU/GPU speed without changing an installed file: the
# doctor's list (one source of truth), read here as the steps saw them.
from dflash.envcheck.probe import VAR_PREFIXES as SETTING_PREFIXES

_T0 = time.perf_counter()
_T0_WALL = time.time()
STAGES = ("data", "transfer", "target", "anchors", "drafter_fwd", "drafter_bwd", "optimizer")


def relevant_variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith(SETTING_PREFIXES)}


class StageClock:
    """Per-stage durations of one step: host clock on CPU, CUDA events on GPU."""

    def __init__(self, device, cpu_time: bool = False) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch
        self.clock = time.process_time if cpu_time else time.perf_counter
        self.marks: list[tuple[str, Any]] = []

    def start(self) -> None:
        self.marks = [("", self._now())]

    def mark(self, stage: str) -> None:
        self.marks.append((stage, self._now()))

    def _now(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.clock()

    def durations(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:], strict=False):
            dt = a.elapsed_time(b) / 1000.0 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out


RENDEZVOUS_TIMEOUT_S = 600.0


def rendezvous(environ: dict[str, str] | None = None) -> float:
    """Seconds spent waiting for the other repeat of a concurrent pair (0 alone).

    Both processes start together, but import and build take seconds and vary; their
    steady steps, a few seconds long, would barely overlap. So each drops a file into
    the pair's directory here and polls (2 ms) until the pair's count is there; the
    runner drops one for a repeat that ended early, so nobody waits for a crash."""
    env = os.environ if environ is None else environ
    spec = env.get(BARRIER_ENV)
    if not spec:
        return 0.0
    where, _, count = spec.rpartition(os.pathsep)
    meet, need = Path(where), int(count)
    (meet / f"ready-{os.getpid()}").touch()
    t0 = time.perf_counter()
    while len(os.listdir(meet)) < need and time.perf_counter() - t0 < RENDEZVOUS_TIMEOUT_S:
        time.sleep(0.002)
    return time.perf_counter() - t0


MIN_STEADY_STEPS = 5  # a steady phase cut short by its budget still has this many


def run_steps(
    run,
    n: int,
    first_index: int,
    clock: StageClock,
    reference=None,
    power: float = 1.0,
    budget_s: float = 0.0,
) -> list[dict[str, Any]]:
    """`n` steps of the trainer's own step function (dflash.step.train_step) on `run`
    (dflash.run.Run), each timed per stage through its `mark` hook."""
    import torch

    from dflash.step import train_step

    dev = run.device
    out: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i in range(first_index, first_index + n):
        if budget_s and len(out) >= MIN_STEADY_STEPS and time.perf_counter() - started > budget_s:
            break
        t0, c0 = time.perf_counter(), time.process_time()
        clock.start()
        res = train_step(run, i, mark=clock.mark)
        t_sync = time.perf_counter()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        stages = clock.durations()
        stages["wait"] = time.perf_counter() - t_sync
        loss = float(res.loss.detach())  # a sync, after the step's own timing
        if not math.isfinite(loss):
            raise RuntimeError(f"benchmark step {i}: loss is not finite")
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens = int(res.tokens)
        row: dict[str, Any] = {"step_s": dt, "cpu_s": cpu, "tokens": tokens, "tok_per_s": tokens / dt, "loss": loss,
               "tok_per_cpu_s": tokens / max(cpu, 1e-9), "stages": stages}  # fmt: skip
        if reference is not None:
            # Right after the step, so both see the same state of the shared host.
            row["ref_s"] = reference.run()
            row["tok_per_ref"] = corrected(row["tok_per_cpu_s"], row["ref_s"], power)
        out.append(row)
    return out


def run_repeat(spec: dict[str, Any], scratch: str) -> dict[str, Any]:
    from dflash.bench.workloads import Workload

    w = Workload.from_definition(spec)
    import torch

    if w.threads is not None:
        torch.set_num_threads(w.threads)
    # Their import time (several seconds) belongs to "import", not to "build".
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    import dflash.data.tokenizer  # noqa: F401
    from dflash.bench.workload_setup import build

    t_import = time.perf_counter()
    if w.pipeline:
        from dflash.bench.pipeline_repeat import run_pipeline_repeat

        res = run_pipeline_repeat(w, scratch)
        return {**res, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                "devices": [], "variables": relevant_variables()}  # fmt: skip
    if w.targets != 1 or w.drafters != 1:
        raise NotImplementedError(
            f"workload {w.name}: topology {w.topology} needs the multi-process pipeline "
            "runner; this worker runs one target and one drafter in one process"
        )
    p = build(w, scratch)
    if p.device.type == "cuda":
        torch.cuda.synchronize()
    t_build = time.perf_counter()
    p.drafter.train()
    clock = StageClock(p.device, cpu_time=w.metric == "cpu")
    first = run_steps(p, 1, 0, clock)
    warm = run_steps(p, w.warmup_steps - 1, 1, clock) if w.warmup_steps > 1 else []
    ref = None
    if w.reference:
        ref = Reference()
        ref.run()  # its own warm-up: first-touch of the destination buffer
    waited = rendezvous()
    steady_t0 = time.time()  # wall clock: comparable between the two processes of a pair
    steady = run_steps(p, w.steps, w.warmup_steps, clock, ref, w.reference_power, w.steady_budget_s)
    return {
        "pid": os.getpid(),
        "import_s": t_import - _T0,
        "build_s": t_build - t_import,
        "first_step_s": first[0]["step_s"],
        "warmup": first + warm,
        "rendezvous_s": waited,
        "steady_t0": steady_t0,
        "steps": steady,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if p.device.type == "cuda"
        else [],
        "variables": relevant_variables(),
    }


def startup_s(environ: dict[str, str] | None = None) -> float:
    """Seconds from the runner's spawn to this module's import: interpreter start-up,
    site hooks (.pth files, sitecustomize) and the entry point's own imports."""
    env = os.environ if environ is None else environ
    spawned = env.get(SPAWN_TIME_ENV)
    return max(0.0, _T0_WALL - float(spawned)) if spawned else 0.0


def main(argv: list[str]) -> int:
    """SPEC and OUT are files; `-` `-` (in a container, image_env.py): the workload from
    $DFLASH_BENCH_SPEC, the result to stdout behind a marker."""
    spec_path, out_path = argv
    if spec_path == "-":
        import tempfile

        from dflash.bench.image_env import RESULT_MARKER, SPEC_ENV

        spec = json.loads(os.environ[SPEC_ENV])
        with tempfile.TemporaryDirectory(prefix="dflash-bench-") as scratch:
            result = run_repeat(spec, scratch)
        result["startup_s"] = startup_s()
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0
    spec = json.loads(Path(spec_path).read_text())
    result = run_repeat(spec, str(Path(out_path).parent / "scratch"))
    result["startup_s"] = startup_s()
    tmp = Path(out_path + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out_path)  # the runner never reads half a file
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
