"""Everything the checks look at, gathered once per doctor run."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from .collect import ProbeData
from .cuda import torch_cuda_major
from .findings import FixContext
from .lockfile import Lock, Resolution


@dataclass
class Context:
    probe: ProbeData
    fix: FixContext
    lock: Lock | None = None
    lock_note: str = ""
    lock_error: str | None = None
    resolution: Resolution | None = None
    other_resolutions: dict[str, Resolution] = field(default_factory=dict)
    extra: str | None = None
    extra_note: str = ""
    manifest: dict[str, Any] | None = None
    manifest_error: str | None = None
    cache_root: Path | None = None
    fingerprint: str = ""
    components: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"  # what the run is meant to use: auto, cpu or cuda (--device)
    verify: bool = False  # hash every installed file (--verify), not just the cheap subset

    @property
    def static(self) -> dict[str, Any]:
        return self.probe.static

    @property
    def dists(self) -> list[dict[str, Any]]:
        return [d for d in self.static["distributions"] if d.get("canonical")]

    @cached_property
    def by_name(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for d in self.dists:
            out.setdefault(d["canonical"], []).append(d)
        return out

    @cached_property
    def installed(self) -> dict[str, str]:
        return {name: ds[0]["version"] for name, ds in self.by_name.items()}

    @property
    def torch_info(self) -> dict[str, Any] | None:
        return self.static.get("torch")

    @property
    def torch_cuda(self) -> str | None:
        info = self.torch_info or {}
        return info.get("cuda")

    @property
    def torch_major(self) -> int | None:
        return torch_cuda_major(self.torch_cuda)

    @cached_property
    def torch_needs(self) -> set[str]:
        """Distributions torch pulls in according to the lock (torch included)."""
        if self.resolution is None or "torch" not in self.resolution.required:
            return set()
        return self.resolution.closure("torch")

    @property
    def site_dirs(self) -> list[str]:
        return list(self.static["interpreter"]["site_dirs"])

    def rel(self, path: str) -> str:
        """A path relative to site-packages where it lies inside it."""
        for site in self.site_dirs:
            if path.startswith(site.rstrip("/") + "/"):
                return path[len(site.rstrip("/")) + 1 :]
        return path

    def label(self, name: str) -> str:
        ds = self.by_name.get(name)
        return f"{ds[0]['name']} {ds[0]['version']}" if ds else name
