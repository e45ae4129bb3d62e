"""Preflight for the trainer and benchmarks: refuse to run in a dirty environment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BANNER = "!" * 100


def run_doctor(*args: Any, **kwargs: Any) -> Any:
    """doctor.run_doctor, imported on first call: importing dflash.envcheck (which
    imports this module) stays light for the commands that start probes first."""
    from .doctor import run_doctor as audit

    return audit(*args, **kwargs)


class DirtyEnvironment(RuntimeError):
    """The environment has doctor errors; `report` is the human report and
    `record` the dict preflight would have returned."""

    def __init__(self, report: str, record: dict[str, Any]) -> None:
        super().__init__(
            "the Python environment does not match its lock (pass --allow-dirty-env to run "
            "anyway; the run will be marked dirty):\n" + report
        )
        self.report = report
        self.record = record


def preflight(
    allow_dirty: bool = False,
    log: Callable[[str], object] = print,
    *,
    import_torch: bool = True,
    lock: str | None = None,
) -> dict[str, Any]:
    """Run the doctor on the current interpreter (probes in subprocesses).

    Raises DirtyEnvironment on errors unless `allow_dirty`, in which case it logs
    a loud banner. Returns {"dirty", "findings", "fingerprint", "extra", "lock",
    "python", "counts"} to be stored with the run record.
    """
    report = run_doctor(None, lock=lock, import_torch=import_torch)
    record: dict[str, Any] = {
        "dirty": not report.ok,
        "findings": [f.to_dict() for f in report.findings],
        "fingerprint": report.fingerprint,
        "extra": report.extra,
        "lock": report.lock,
        "python": report.python,
        "counts": report.counts(),
    }
    if report.ok:
        c = report.counts()
        log(
            f"dflash doctor: environment clean ({c['warning']} warning(s)), "
            f"fingerprint {report.fingerprint[:16]}"
        )
        for f in report.findings:
            if f.severity == "warning":
                log(f"  warning {f.code}: {f.message}")
        return record
    from .doctor_report import render_human

    text = render_human(report, show_info=False)
    if not allow_dirty:
        raise DirtyEnvironment(text, record)
    log(
        "\n".join(
            [
                BANNER,
                "DIRTY ENVIRONMENT: running anyway (--allow-dirty-env). Results of this run are",
                "not comparable with clean runs and are recorded as dirty.",
                BANNER,
                text,
                BANNER,
            ]
        )
    )
    return record
