"""Small real wheels built on the spot, for tests that install a package into a venv.

A wheel is a zip with a .dist-info directory (METADATA, WHEEL, RECORD with the sha256
of every file); uv and pip install it like any other, offline.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

# Started by a .pth line at interpreter start-up, as telemetry and "autopatch" packages
# do: a daemon thread that spends `busy` seconds of every `busy + idle` in Python
# bytecode, holding the GIL. busy 1.0, idle 0 is the fully busy thread.
BUSY_THREAD_MODULE = """\
import threading
import time

BUSY, IDLE = {busy!r}, {idle!r}


def _spin():
    while True:
        end = time.perf_counter() + BUSY
        while time.perf_counter() < end:
            pass
        if IDLE:
            time.sleep(IDLE)


threading.Thread(target=_spin, name="{name}-telemetry", daemon=True).start()
"""


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(out_dir: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A py3-none-any wheel of distribution `name` holding `files` (path -> text)."""
    norm = name.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    contents = {path: text.encode() for path, text in files.items()}
    contents[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    contents[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: dflash-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{p},{_digest(d)},{len(d)}" for p, d in contents.items()]
    contents[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in contents.items():
            zf.writestr(p, d)
    return path


def busy_thread_wheel(out_dir: Path, name: str, busy: float = 1.0, idle: float = 0.0) -> Path:
    """A package whose .pth file starts a GIL-holding thread in every interpreter."""
    module = name.replace("-", "_") + "_hook"
    return make_wheel(
        out_dir,
        name,
        "1.0",
        {
            f"{module}.py": BUSY_THREAD_MODULE.format(busy=busy, idle=idle, name=name),
            f"{name.replace('-', '_')}.pth": f"import {module}\n",
        },
    )


def inert_wheel(out_dir: Path, name: str) -> Path:
    """A package that installs one module and does nothing at start-up."""
    return make_wheel(out_dir, name, "1.0", {f"{name.replace('-', '_')}.py": "VALUE = 1\n"})
