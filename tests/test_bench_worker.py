"""The real repeat worker on a micro workload, in-process: the record's shape and
that every stage is timed. No assertion on speed."""

from __future__ import annotations

import pytest

from dflash.bench.workloads import WORKLOADS, Workload, get_workload


@pytest.fixture
def micro() -> Workload:
    return get_workload("tiny-cpu").with_changes(
        name="micro", seq_len=128, rows=1, max_anchors=8, warmup_steps=2, steps=2, repeats=1
    )


def test_worker_times_every_stage(micro, tmp_path):
    from dflash.bench.worker import STAGES, run_repeat

    res = run_repeat(micro.definition(), str(tmp_path))
    assert len(res["warmup"]) == 2 and len(res["steps"]) == 2
    for step in res["steps"]:
        assert step["tokens"] == 128
        assert step["tok_per_s"] > 0 and step["tok_per_cpu_s"] > 0
        assert set(step["stages"]) == {*STAGES, "wait"}
        assert sum(step["stages"].values()) <= step["step_s"] * 1.05
    assert res["threads"] == 1


def test_summary_uses_one_sample_per_repeat(micro, tmp_path):
    from dflash.bench.runner import repeat_sample, summarize
    from dflash.bench.worker import run_repeat

    reps = []
    for i in range(2):
        r = run_repeat(micro.definition(), str(tmp_path))
        r.update(repeat=i, process_s=1.0, import_s=0.5)
        reps.append(r)
    s = summarize(micro, reps)
    assert len(s["samples"]) == 2 and s["metric"] == "tok_per_ref"
    assert s["stages_s"]["target"] > 0
    # The corrected samples and the raw ones they came from, and the host's speed.
    assert len(s["reference_s"]) == 2 and min(s["reference_s"]) > 0
    assert s["uncorrected_samples"] == [
        repeat_sample(micro, r["steps"], "tok_per_cpu_s") for r in reps
    ]


def test_reference_runs_after_every_steady_step_on_the_cpu_clock(micro, tmp_path):
    from dflash.bench.reference import REF_NOMINAL_S
    from dflash.bench.worker import run_repeat

    assert micro.reference_power == 2.0
    res = run_repeat(micro.definition(), str(tmp_path))
    for step in res["steps"]:
        assert step["ref_s"] > 0
        scale = (step["ref_s"] / REF_NOMINAL_S) ** micro.reference_power
        assert step["tok_per_ref"] == pytest.approx(step["tok_per_cpu_s"] * scale)
        # Outside the step's own timing: the stages still add up to the step.
        assert sum(step["stages"].values()) <= step["step_s"] * 1.05
    assert all("ref_s" not in s for s in res["warmup"])
    plain = run_repeat(micro.with_changes(reference=0).definition(), str(tmp_path))
    assert all("ref_s" not in s for s in plain["steps"])


def test_reference_is_part_of_the_workload_and_validated():
    w = get_workload("tiny-cpu")
    assert w.reference and w.metric_key == "tok_per_ref" and w.unit == "tok/cpu-s@ref"
    assert w.with_changes(reference_power=1.0).hash() != w.hash()
    with pytest.raises(ValueError, match="reference_power must be > 0"):
        w.with_changes(reference_power=0.0)
    assert w.with_changes(reference=0).hash() != w.hash()
    assert w.with_changes(reference=0).metric_key == "tok_per_cpu_s"
    with pytest.raises(ValueError, match="reference needs metric 'cpu'"):
        w.with_changes(metric="wall")
    with pytest.raises(ValueError, match="reference version 99"):
        w.with_changes(reference=99)
    with pytest.raises(ValueError, match="metric must be"):
        w.with_changes(reference=0, metric="gpu")
    assert not get_workload("tiny-cpu-pipe").reference
    assert not get_workload("qwen3-8b-1gpu").reference


def test_workload_hash_ignores_repeats_but_not_shapes():
    w = WORKLOADS["tiny-cpu"]
    assert w.with_changes(repeats=9).hash() == w.hash()
    assert w.with_changes(max_anchors=64).hash() != w.hash()
    assert w.with_changes(targets=2).hash() != w.hash()


def test_gpu_workload_is_qwen3_8b_shaped_without_allocating(monkeypatch):
    import torch
    from transformers import Qwen3ForCausalLM

    from dflash.bench.workload_setup import target_config

    w = get_workload("qwen3-8b-1gpu")
    assert (w.block_size, w.max_anchors, w.seq_len, w.draft_layers) == (16, 512, 3072, 5)
    config = target_config(w, tokenizer_len=336)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    assert 8.0e9 < n < 8.4e9  # Qwen3-8B: 8.19B parameters with its untied LM head
    assert config.vocab_size == 151936


def test_unsupported_topology_is_an_error_not_a_silent_single_process(tmp_path):
    from dflash.bench.worker import run_repeat

    w = get_workload("tiny-cpu").with_changes(targets=2)
    with pytest.raises(NotImplementedError, match="2T\\+1D/colocated"):
        run_repeat(w.definition(), str(tmp_path))


def test_speed_variables_are_the_doctors_list():
    from dflash.bench.worker import SETTING_PREFIXES, relevant_variables
    from dflash.envcheck.probe import VAR_PREFIXES

    assert SETTING_PREFIXES is VAR_PREFIXES  # one list for the doctor and the bench
    speed = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "MALLOC_PERTURB_": "165", "PYTHONMALLOC": "debug", "OMP_NUM_THREADS": "4"}  # fmt: skip
    other = {"PYTHONUNBUFFERED": "1", "HOME": "/root", "PATH": "/usr/bin"}
    assert relevant_variables({**speed, **other}) == dict(sorted(speed.items()))


def test_steady_budget_cuts_the_phase_but_keeps_min_steps(micro, tmp_path):
    from dflash.bench.worker import MIN_STEADY_STEPS, run_repeat

    w = micro.with_changes(steps=MIN_STEADY_STEPS + 3, steady_budget_s=1e-9)
    res = run_repeat(w.definition(), str(tmp_path))
    assert len(res["steps"]) == MIN_STEADY_STEPS
    # A policy like `repeats`: records with and without a budget stay comparable.
    assert w.hash() == micro.with_changes(steps=w.steps).hash()


def test_reference_runs_on_the_thread_clock():
    import time

    from dflash.bench.reference import REFERENCE_VERSION, Reference

    assert REFERENCE_VERSION == 2 and Reference().clock is time.thread_time


def test_repeat_is_a_fresh_console_script_process(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    from dflash.bench.envs import SPAWN_TIME_ENV, BenchEnv

    env = BenchEnv(Path(sys.executable), "c", variables={"OMP_NUM_THREADS": "3"}, unset=("HOME",))
    cmd = env.command(tmp_path / "s.json", tmp_path / "o.json")
    assert cmd[0] == str(Path(sys.executable).parent / "dflash") and cmd[1:3] == ["bench", "worker"]
    monkeypatch.setenv("HOME", "/nowhere")
    e = env.environ()
    assert e["OMP_NUM_THREADS"] == "3" and "HOME" not in e and float(e[SPAWN_TIME_ENV]) > 0
