"""Runtime probe, run INSIDE the audited interpreter as `python -I probe_torch.py`.

Imports torch in a throw-away process (never in the doctor itself) and reports
which shared libraries the dynamic loader actually mapped: after `import torch`
(torch 2.10 maps its whole CUDA stack at import, even without a GPU) and again
after CUDA initialisation plus a few tiny kernels where a GPU is usable, since
cuDNN and cuBLAS dlopen further libraries lazily. Standard library plus torch only.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

MARKER = "DFLASH_PROBE_JSON:"


def mapped_libraries() -> list[str]:
    paths: set[str] = set()
    with open(f"/proc/{os.getpid()}/maps") as fh:
        for line in fh:
            parts = line.split(None, 5)
            if len(parts) == 6:
                path = parts[5].strip()
                base = os.path.basename(path)
                if path.startswith("/") and (base.endswith(".so") or ".so." in base):
                    paths.add(path)
    return sorted(paths)


def exercise_cuda(t: Any, out: dict[str, object]) -> None:
    """Touch cuBLAS, cuDNN and NCCL so their lazily loaded parts get mapped."""
    t.cuda.init()
    out["devices"] = [
        {"name": t.cuda.get_device_name(i), "capability": list(t.cuda.get_device_capability(i))}
        for i in range(t.cuda.device_count())
    ]
    a = t.ones(8, 8, device="cuda")
    (a @ a).sum().item()
    x = t.ones(1, 1, 8, 8, device="cuda")
    w = t.ones(1, 1, 3, 3, device="cuda")
    t.nn.functional.conv2d(x, w).sum().item()
    t.cuda.synchronize()


def collect() -> dict[str, object]:
    out: dict[str, object] = {"imported": False}
    try:
        import torch
    except BaseException:  # noqa: BLE001 - any failure to import is the finding
        out["error"] = traceback.format_exc(limit=3)[-4000:]
        out["maps_after_failed_import"] = mapped_libraries()
        return out
    out.update(
        imported=True,
        file=torch.__file__,
        version=torch.__version__,
        cuda=torch.version.cuda,
        maps_after_import=mapped_libraries(),
    )
    for key, query in (
        ("cudnn_version", lambda: torch.backends.cudnn.version()),
        ("nccl_version", lambda: list(torch.cuda.nccl.version())),
    ):
        try:
            out[key] = query()
        except Exception as exc:  # noqa: BLE001 - report, don't die
            out[key + "_error"] = f"{type(exc).__name__}: {exc}"
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        try:
            exercise_cuda(torch, out)
        except Exception:  # noqa: BLE001
            out["cuda_error"] = traceback.format_exc(limit=3)[-4000:]
        out["maps_after_cuda_init"] = mapped_libraries()
    return out


if __name__ == "__main__":
    result = collect()
    sys.stdout.flush()
    print(MARKER + json.dumps(result))
