"""RUN/metrics.jsonl as MetricsLogger writes it: every record carries the wall clock at
writing, and a resume drops the records past its checkpoint."""

import json
import time

from dflash.metrics import MetricsLogger


def _rec(step: int) -> dict:
    return {"step": step, "loss": 1.0, "acc": 0.5, "acc_per_slot": [0.5], "lr": 1e-3,
            "grad_norm": 1.0, "tok_per_s": 100.0}  # fmt: skip


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_each_record_has_the_wall_clock_at_writing(tmp_path):
    log = MetricsLogger(tmp_path, config={}, wandb_mode="off", extra={"dirty_env": False})
    before = time.time()
    log.log(_rec(1))
    time.sleep(0.05)
    log.log(_rec(2))
    after = time.time()
    log.close()
    recs = _lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2]
    assert all(before - 0.001 <= r["time"] <= after + 0.001 for r in recs)
    assert recs[1]["time"] - recs[0]["time"] >= 0.04  # written 50 ms apart
    assert recs[0]["dirty_env"] is False


def test_a_resume_keeps_the_records_up_to_its_step_with_their_times(tmp_path):
    log = MetricsLogger(tmp_path, config={}, wandb_mode="off")
    for s in (1, 2, 3):
        log.log(_rec(s))
    log.close()
    kept = _lines(tmp_path / "metrics.jsonl")[:2]
    log = MetricsLogger(tmp_path, config={}, wandb_mode="off", resume_step=2)
    log.log(_rec(3))
    log.close()
    recs = _lines(tmp_path / "metrics.jsonl")
    assert recs[:2] == kept
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[2]["time"] >= kept[1]["time"]


def test_wandb_gets_the_metrics_but_not_the_time(tmp_path):
    class Run:  # what MetricsLogger calls on a wandb run
        def __init__(self) -> None:
            self.logged: list[tuple[dict, int]] = []

        def log(self, flat: dict, step: int) -> None:
            self.logged.append((flat, step))

        def finish(self) -> None:
            pass

    log = MetricsLogger(tmp_path, config={}, wandb_mode="off", extra={"dirty_env": False})
    log.wandb = Run()  # type: ignore[assignment]
    log.log(_rec(1))
    flat, step = log.wandb.logged[0]
    log.close()
    assert step == 1 and "time" not in flat
    assert flat["loss"] == 1.0 and flat["dirty_env"] is False and flat["acc_slot/1"] == 0.5
    assert "time" in _lines(tmp_path / "metrics.jsonl")[0]
