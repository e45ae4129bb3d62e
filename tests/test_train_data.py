"""Training on chat data through the chat template and loss-mask path, and --compile."""

import json

import pytest

from dflash.config import TrainConfig
from dflash.data.sources import DataError
from dflash.train import train


def write_chats(path, n=40, bad_line=None):
    lines = []
    for i in range(n):
        q = f"What is {i} plus {i}?"
        a = f"The sum of {i} and {i} is {2 * i}. " * 3
        lines.append(
            json.dumps(
                {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
        )
    if bad_line is not None:
        lines.insert(bad_line, "{not json")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trains_on_chat_jsonl(tmp_path):
    data = write_chats(tmp_path / "chats.jsonl")
    summary = train(
        TrainConfig(
            out=str(tmp_path / "run"), data=str(data), wandb="off", max_steps=6, log_every=2
        )
    )
    rec = summary["last"]
    assert rec["step"] == 6 and rec["loss"] > 0
    assert rec["data"]["samples"] > 0 and rec["data"]["dropped_short"] == 0
    assert (tmp_path / "run" / "drafter" / "config.json").exists()


def test_malformed_line_names_file_and_line_or_is_skipped(tmp_path):
    data = write_chats(tmp_path / "chats.jsonl", bad_line=3)
    with pytest.raises(DataError, match=r"chats\.jsonl.*line 4"):
        train(TrainConfig(out=str(tmp_path / "a"), data=str(data), wandb="off", max_steps=2))
    summary = train(
        TrainConfig(
            out=str(tmp_path / "b"),
            data=str(data),
            wandb="off",
            max_steps=2,
            log_every=1,
            skip_bad_rows=True,
        )
    )
    assert summary["last"]["data"]["bad_rows"] == 1


def test_all_samples_too_short_is_a_clear_error(tmp_path):
    rows = [{"prompt": "hi", "response": "ok"}] * 5
    data = tmp_path / "short.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="min_loss_tokens|too short|fewer than"):
        train(TrainConfig(out=str(tmp_path / "run"), data=str(data), wandb="off", max_steps=2))


@pytest.mark.slow
def test_compiled_drafter_matches_eager(tmp_path):
    """--compile (main thread, static shapes) gives the eager loss trace within float noise."""
    kw = dict(wandb="off", max_steps=4, log_every=1)
    train(TrainConfig(out=str(tmp_path / "eager"), **kw))
    train(TrainConfig(out=str(tmp_path / "compiled"), compile=True, **kw))

    def trace(name):
        return [
            json.loads(x)["loss"]
            for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]

    assert trace("compiled") == pytest.approx(trace("eager"), rel=1e-3)
