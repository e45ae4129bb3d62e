"""GPU and driver probe, run INSIDE the audited interpreter as `python -I probe_gpu.py`.

NVML through `pynvml` (package nvidia-ml-py) when the audited environment has
it, otherwise `nvidia-smi` from PATH, otherwise it reports that no GPU tooling
was found. Standard library only, so it runs in any environment.
"""

from __future__ import annotations

import json
import shutil
import subprocess

MARKER = "DFLASH_PROBE_JSON:"
SMI_FIELDS = "name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw"
# Renamed from clocks_throttle_reasons.* in newer drivers; try the new name first.
SMI_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def via_nvml() -> dict[str, object] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound etc. mean "no GPU"
        return {"source": "nvml", "error": f"{type(exc).__name__}: {exc}", "gpus": []}
    try:
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            sm = pynvml.NVML_CLOCK_SM
            gpus.append(
                {
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, sm),
                    "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, sm),
                    "temperature_c": pynvml.nvmlDeviceGetTemperature(
                        h, pynvml.NVML_TEMPERATURE_GPU
                    ),
                    "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    "reasons": int(reasons(h)),
                }
            )
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        return {"source": "nvml", "driver": driver, "gpus": gpus}
    except Exception as exc:  # noqa: BLE001
        return {"source": "nvml", "error": f"{type(exc).__name__}: {exc}", "gpus": []}
    finally:
        pynvml.nvmlShutdown()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def via_smi() -> dict[str, object] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    last_error = ""
    for reason_field in SMI_REASON_FIELDS:
        cmd = [exe, f"--query-gpu={SMI_FIELDS},{reason_field}", "--format=csv,noheader,nounits"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"source": "nvidia-smi", "error": str(exc), "gpus": []}
        if proc.returncode != 0:
            last_error = (proc.stdout + proc.stderr).strip()[-500:]
            continue
        gpus, driver = [], None
        for line in proc.stdout.strip().splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) != 7:
                continue
            driver = cols[1]
            reasons = int(cols[6], 16) if cols[6].lower().startswith("0x") else None
            gpus.append(
                {
                    "name": cols[0],
                    "sm_clock_mhz": _number(cols[2]),
                    "max_sm_clock_mhz": _number(cols[3]),
                    "temperature_c": _number(cols[4]),
                    "power_w": _number(cols[5]),
                    "reasons": reasons,
                }
            )
        return {"source": "nvidia-smi", "driver": driver, "gpus": gpus}
    return {"source": "nvidia-smi", "error": last_error, "gpus": []}


def collect() -> dict[str, object]:
    return via_nvml() or via_smi() or {"source": None, "gpus": []}


if __name__ == "__main__":
    print(MARKER + json.dumps(collect()))
