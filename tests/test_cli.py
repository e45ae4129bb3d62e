"""`dflash train` as users run it: a real process, real signals."""

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DFLASH = [sys.executable, "-m", "dflash.cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def run(*args, timeout=300):
    return subprocess.run(
        [*DFLASH, *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def test_train_help_lists_config_flags():
    out = run("train", "--help").stdout
    for flag in (
        "--block-size",
        "--max-anchors",
        "--resume",
        "--allow-dirty-env",
        "--skip-bad-rows",
    ):
        assert flag in out


def test_bad_flag_value_names_the_flag(tmp_path):
    res = run("train", "--out", str(tmp_path / "r"), "--block-size", "1")
    assert res.returncode == 2
    assert "--block-size must be >= 2" in res.stderr


def test_train_tiny_end_to_end(tmp_path):
    res = run(
        "train",
        "--preset",
        "tiny",
        "--max-steps",
        "3",
        "--out",
        str(tmp_path / "r"),
        "--wandb",
        "off",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "dflash doctor" in res.stdout  # preflight ran
    assert (tmp_path / "r" / "drafter" / "model.safetensors").exists()
    assert json.loads((tmp_path / "r" / "run.json").read_text())["environment"]["dirty"] is False


def test_bare_train_runs_the_tiny_recipe_and_says_what_next(tmp_path):
    """`dflash train` with no recipe and no flags is never a usage error."""
    res = subprocess.run(
        [sys.executable, "-m", "dflash", "train"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny-")
    assert (run_dir / "drafter" / "model.safetensors").exists()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["recipe"]["shipped"] == "tiny" and record["config"]["device"] == "cpu"
    assert "--show-recipe qwen3-8b > dflash.toml" in res.stdout
    shown = run("train", "--show-recipe", "qwen3-8b")
    assert shown.returncode == 0 and 'preset = "qwen3-8b"' in shown.stdout


def _metric_steps(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


def test_sigterm_checkpoints_and_resume_finishes(tmp_path):
    out = tmp_path / "r"
    args = ["train", "--max-steps", "3000", "--log-every", "1", "--out", str(out), "--wandb", "off"]
    proc = subprocess.Popen(
        [*DFLASH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )
    deadline = time.time() + 240
    while len(_metric_steps(out / "metrics.jsonl")) < 3:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "training never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "continue with --resume" in err
    stopped = max(_metric_steps(out / "metrics.jsonl"))
    assert stopped < 3000
    ckpts = sorted((out / "checkpoints").iterdir())
    assert ckpts[-1].name == f"step_{stopped:08d}"
    res = run(
        "train",
        "--max-steps",
        str(stopped + 3),
        "--log-every",
        "1",
        "--out",
        str(out),
        "--wandb",
        "off",
        "--resume",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resumed from {ckpts[-1]}" in res.stdout
    assert _metric_steps(out / "metrics.jsonl") == list(range(1, stopped + 4))


@pytest.mark.parametrize("args", [["--preset", "qwen3-8b"], ["--attn", "fast"]])
def test_config_errors_exit_2(tmp_path, args):
    res = run("train", "--out", str(tmp_path / "r"), *args)
    assert res.returncode == 2 and "dflash train:" in res.stderr


def test_dirty_environment_refused_unless_allowed_and_then_marked(tmp_path):
    """A lock that disagrees with what is installed makes the environment dirty."""
    lock = (Path(__file__).resolve().parents[1] / "uv.lock").read_text()
    installed = importlib.metadata.version("tqdm")
    needle = f'name = "tqdm"\nversion = "{installed}"'
    assert needle in lock
    (tmp_path / "uv.lock").write_text(lock.replace(needle, 'name = "tqdm"\nversion = "0.0.1"'))
    env = {**ENV, "DFLASH_LOCK": str(tmp_path / "uv.lock")}
    args = [*DFLASH, "train", "--max-steps", "2", "--log-every", "1", "--wandb", "off"]
    refused = subprocess.run(
        [*args, "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=300
    )
    assert refused.returncode == 3
    assert "VERSION_MISMATCH" in refused.stderr and "--allow-dirty-env" in refused.stderr
    assert not (tmp_path / "a").exists()
    ran = subprocess.run(
        [*args, "--out", str(tmp_path / "b"), "--allow-dirty-env"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "DIRTY ENVIRONMENT" in ran.stdout + ran.stderr
    recs = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert recs and all(r["dirty_env"] is True for r in recs)
    run_record = json.loads((tmp_path / "b" / "run.json").read_text())
    assert run_record["environment"]["dirty"] is True


def test_config_of_is_the_train_commands_parse(tmp_path, capsys):
    """What benches build their runs from (train_cli.config_of): the flags the CLI takes,
    a bad value as argparse's usage error naming the flag, a bad setting as ValueError."""
    from dflash.train_cli import config_of, parser

    cfg = config_of(["--out", str(tmp_path), "--block-size", "8", "--wandb", "off"])
    assert (cfg.block_size, cfg.out) == (8, str(tmp_path))
    with pytest.raises(SystemExit) as e:
        config_of(["--out", str(tmp_path), "--lr", "abc"])
    assert e.value.code == 2
    assert (
        "dflash train: error: argument --lr: invalid float value: 'abc'" in capsys.readouterr().err
    )
    with pytest.raises(ValueError, match="--block-size must be >= 2"):
        config_of(["--out", str(tmp_path), "--block-size", "1"])
    with pytest.raises(argparse.ArgumentError, match="--lr"):  # for benches that check first
        parser(exit_on_error=False).parse_known_args(["--lr", "abc"])
