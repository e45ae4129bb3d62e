"""Run recipes: every shipped one validates, bad ones fail in one line naming file and key,
flags override them, and the preset never overwrites an explicit value."""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dflash import recipes
from dflash.config import PRESETS, TrainConfig
from dflash.distributed.launch import config_argv
from dflash.train_cli import default_out, parser, resolve

ROOT = Path(__file__).resolve().parents[1]


def parse(*argv: str) -> argparse.Namespace:
    return parser().parse_args(list(argv))


def error(*argv: str) -> str:
    with pytest.raises(ValueError) as e:
        resolve(parse(*argv))
    msg = str(e.value)
    assert "\n" not in msg  # one line
    return msg


def test_shipped_recipes_exist_and_validate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert {"tiny", "qwen3-8b"} <= set(recipes.shipped())
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    (tmp_path / "regen.jsonl").write_text("")
    for name, path in recipes.shipped().items():
        recipe = recipes.load(str(path))
        assert set(recipe.values) <= set(recipes.KEYS), name
        assert recipe.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        cfg, _ = resolve(parse("--config", name, "--target", str(model)))
        for key, value in recipe.values.items():
            assert getattr(cfg, key) == value, (name, key)
        for key, value in PRESETS[cfg.preset].items():
            assert getattr(cfg, key) == recipe.values.get(key, value), (name, key)


def test_qwen3_recipe_says_how_to_set_the_target(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    msg = error("--config", "recipes/qwen3-8b.toml")
    assert "qwen3-8b.toml: key 'target' missing" in msg
    assert 'target = "/models/Qwen3-8B"' in msg and "--target" in msg
    assert "--target '/nope': no such directory" in error(
        "--config", "qwen3-8b", "--target", "/nope"
    )


def test_shipped_names_and_local_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = recipes.shipped()["tiny"]
    for spec in ("tiny", "tiny.toml", "recipes/tiny.toml"):
        assert recipes.resolve(spec) == tiny
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "tiny.toml").write_text("max_steps = 4\n")  # a local file wins
    assert resolve(parse("--config", "recipes/tiny.toml"))[0].max_steps == 4
    msg = error("--config", "elsewhere/tiny.toml")
    assert "elsewhere/tiny.toml: no such recipe file" in msg and "qwen3-8b" in msg


@pytest.mark.parametrize(
    "text, expected",
    [
        ("max_step = 3\n", "unknown key 'max_step'; did you mean max_steps?"),
        ("max-steps = 3\n", "unknown key 'max-steps'; did you mean max_steps?"),
        ("zzz = 3\n", "unknown key 'zzz'; valid keys: out, preset,"),
        ("config = 'other.toml'\n", "unknown key 'config'"),
        ("block_size = 1\n", "key 'block_size' must be >= 2, got 1"),
        ("max_steps = 0\n", "key 'max_steps' must be > 0, got 0"),
        ("seq_len = '256'\n", "key 'seq_len' must be int, got '256' (str)"),
        ("compile = 1\n", "key 'compile' must be bool, got 1 (int)"),
        ("attn = 'fast'\n", "key 'attn' must be one of ('auto', 'sdpa', 'flex'), got 'fast'"),
        ("preset = 'tinyy'\n", "key 'preset' 'tinyy' unknown; choose one of ['qwen3-8b', 'tiny']"),
        ("[train]\nmax_steps = 3\n", "unknown key 'train'"),
        ("max_steps = \n", "not valid TOML"),
    ],
)
def test_bad_recipe_one_line_naming_file_and_key(tmp_path, text, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    msg = error("--config", str(path))
    assert msg.startswith(f"{path}: ") and expected in msg, msg


def test_flags_override_the_recipe(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("max_steps = 7\nlog_every = 2\ncompile = true\nlr = 1\nout = 'x'\n")
    cfg, recipe = resolve(parse("--config", str(path), "--max-steps", "9", "--no-compile"))
    assert (cfg.max_steps, cfg.log_every, cfg.compile, cfg.lr, cfg.out) == (9, 2, False, 1.0, "x")
    assert cfg.config == str(path) and recipe.record()["sha256"] == recipe.sha256
    # A flag's bad value names the flag, not the recipe.
    assert error("--config", str(path), "--log-every", "0") == "--log-every must be > 0, got 0"
    # torchrun children get config_argv: they must rebuild exactly this config, the
    # recipe's compile = true overridden by the parent's --no-compile included.
    assert resolve(parse(*config_argv(cfg)))[0] == cfg


def test_presets_fill_only_what_is_unset():
    cfg = TrainConfig(out="x")
    assert cfg.max_steps == PRESETS["tiny"]["max_steps"]
    for field in ("max_steps", "seq_len", "max_anchors", "draft_layers", "log_every", "lr"):
        with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} must be > 0, got 0"):
            TrainConfig(out="x", **{field: 0})
    assert "--max-steps must be > 0, got 0" in error("--max-steps", "0")
    assert TrainConfig(out="x", max_steps=1, block_size=2).block_size == 2


def test_default_out_is_runs_preset_utc_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = default_out("tiny")
    assert re.fullmatch(r"runs/tiny-\d{8}T\d{6}Z", first)
    Path(first).mkdir(parents=True)
    second = default_out("tiny")
    assert second != first and second.startswith(first) and not Path(second).exists()
    assert re.fullmatch(r"runs/tiny-\d{8}T\d{6}Z(-\d+)?", resolve(parse())[0].out)
    assert "pass --out" in error("--resume")
    monkeypatch.setenv("WORLD_SIZE", "2")  # every rank must agree on one directory
    assert "every rank needs the same run directory" in error()


@pytest.mark.slow
def test_dflash_toml_in_the_working_directory_and_resume(tmp_path):
    """`dflash train` reads ./dflash.toml; flags override it; run.json keeps its sha256;
    `--resume` elsewhere continues from that recipe."""
    text = "max_steps = 2\nlog_every = 1\nwandb = 'off'\nlr = 1e-3\nout = 'runs/from-recipe'\n"
    (tmp_path / "dflash.toml").write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    res = subprocess.run(
        [sys.executable, "-m", "dflash", "train", "--max-steps", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "runs" / "from-recipe"
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["recipe"] == {
        "path": str(tmp_path / "dflash.toml"),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "shipped": None,
    }
    assert record["config"]["max_steps"] == 3 and record["config"]["log_every"] == 1
    assert "That was the tiny preset" not in res.stdout  # a recipe is not the bare default
    # --resume from elsewhere, without --config: the run continues from the recipe it
    # was started from (its lr differs from the preset's, so the preset would not do).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "dflash", "train", "--resume", "--out", str(run_dir)]
        + ["--max-steps", "4"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_wheel_ships_the_recipes(tmp_path):
    """The image installs the wheel: the recipes must be package data inside it."""
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the wheel (CI installs it)"
    subprocess.run(
        [uv, "build", "--wheel", "-q", "-o", str(tmp_path)],
        cwd=ROOT,
        check=True,
        timeout=300,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in recipes.shipped():
        assert f"dflash/recipes/{name}.toml" in names
    assert "dflash/__main__.py" in names
