"""Environment fingerprint and manifest (the diff between two is manifest_diff.py).

The fingerprint is a sha256 over a canonical JSON of five components:
  interpreter   implementation, version, machine, platform, libc (never paths)
  distributions every installed distribution, canonical name -> version
  libraries     every shared library listed in a RECORD, by path relative to
                site-packages -> size and a sampled sha256 (size + first and
                last 256 KiB, see probe.py: hashing the 5 GB of CUDA libraries
                in full takes ~10 s, sampling ~0.1 s and still tells builds
                apart, since the ELF header, the build-id note and the section
                tables sit at the two ends; a same-size edit confined to
                the middle would go unnoticed, and no installer makes one)
  torch         torch/version.py: version, CUDA, git revision, debug, HIP
  variables     performance-relevant variables, minus per-process ones
It is path-independent: the same lock synced into two directories gives the
same fingerprint. `installation` digests everything but the variables: that is
what "mutated in place" compares, since a container's runtime variables differ
from the build's without the image having changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from typing import Any

SCHEMA = 1
COMPONENTS = ("interpreter", "distributions", "libraries", "torch", "variables")
INSTALLATION = ("interpreter", "distributions", "libraries", "torch")

# Variables left out of the fingerprint: per-process or per-rank values that
# do not change the installed software or generated code. The compile-cache
# paths are derived FROM the fingerprint, so they cannot be part of it.
_EXCLUDED_VARS = re.compile(
    r"^(TORCHINDUCTOR_CACHE_DIR|TRITON_CACHE_DIR|CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES"
    r"|NVIDIA_DRIVER_CAPABILITIES|OMP_NUM_THREADS"
    r"|MKL_NUM_THREADS|TORCHELASTIC_\w+|TORCH_LOGS|TORCH_TRACE|NCCL_DEBUG\w*"
    r"|TORCH_SHOW_CPP_STACKTRACES)$"
)
_TORCH_KEYS = ("__version__", "cuda", "git_version", "debug", "hip", "rocm", "xpu")


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def fingerprint_variables(variables: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(variables.items()) if not _EXCLUDED_VARS.match(k)}


def components_from_probe(static: Mapping[str, Any]) -> dict[str, Any]:
    interp = static["interpreter"]
    dists: dict[str, str] = {}
    for d in static["distributions"]:
        if d.get("canonical"):
            # Duplicates (two dist-infos for one name) must change the hash too.
            key = d["canonical"] if d["canonical"] not in dists else d["canonical"] + "#2"
            dists[key] = d["version"]
    libraries = {
        lib["rel"]: {"size": lib["size"], "sha256_sampled": lib["sha256_sampled"]}
        for lib in static["libraries"].values()
    }
    for d in static["distributions"]:
        for rel in d["missing"]:
            base = rel.rsplit("/", 1)[-1]
            if base.endswith(".so") or ".so." in base:
                libraries[rel] = {"size": None, "sha256_sampled": None}  # a hole
    torch = static.get("torch") or {}
    return {
        "interpreter": {
            k: interp[k] for k in ("implementation", "version", "machine", "platform", "libc")
        },
        "distributions": dict(sorted(dists.items())),
        "libraries": dict(sorted(libraries.items())),
        "torch": {k: torch.get(k) for k in _TORCH_KEYS} if torch else None,
        "variables": fingerprint_variables(static.get("variables", {})),
    }


def digests(components: Mapping[str, Any]) -> dict[str, str]:
    out = {name: _digest(components[name]) for name in COMPONENTS}
    out["installation"] = _digest({n: out[n] for n in INSTALLATION})
    return out


def fingerprint(components: Mapping[str, Any]) -> str:
    d = digests(components)
    return _digest({"schema": SCHEMA, **{n: d[n] for n in COMPONENTS}})


def build_manifest(static: Mapping[str, Any], extra: str | None = None) -> dict[str, Any]:
    comps = components_from_probe(static)
    return {
        "schema": SCHEMA,
        "fingerprint": fingerprint(comps),
        "digests": digests(comps),
        "extra": extra,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": static["interpreter"]["executable"],
        "prefix": static["interpreter"]["prefix"],
        **comps,
        # per distribution, the digest of every file's (path, size, mtime) at build
        # time: the baseline that lets later doctor runs find files changed in place
        # (verify.py); outside the fingerprint, since mtimes are no part of identity
        "record_stats": {
            d["dist_info"]: d.get("stat_digest")
            for d in static["distributions"]
            if d.get("dist_info") and d.get("stat_digest")
        },
    }


def environment_fingerprint(python: str | None = None) -> str:
    """Fingerprint of `python`'s environment (default: this interpreter), from the
    static probe run in a subprocess (~0.5 s; torch is not imported)."""
    from .collect import collect_static

    return fingerprint(components_from_probe(collect_static(python)))
