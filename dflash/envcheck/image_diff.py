"""`dflash image diff A B` and `dflash env diff A B`: one report over the manifest diff.

  dflash image diff A B [--json] [--engine auto|docker|podman|buildah]
  dflash env diff A B [--json]

Each side is, tried in this order:
  a file       a manifest (`dflash env manifest --out`) or a bench record embedding one
               (an image run's record also brings the image's labels)
  a directory  a venv (its bin/python is probed now, like `dflash env manifest`)
  an image     (image diff only) read without starting it, see image_read.py
Prints distributions added, removed or changed; native libraries (soname, owner and
version, sampled sha256, size); the torch build of each side and its changes; the
labels; site-packages files no RECORD explains. Exit 0 when nothing differs, 1 when
something does, 2 on bad input with a one-line error naming it. Image ids are shown
but not compared: two builds of the same inputs get different ids (timestamps).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .image_read import BadInput, choose_reader, image_manifest, inspect
from .manifest_diff import diff_manifests, diff_maps, differs, summarize_diff

LIMIT = 50  # lines per kind and section in the human report


@dataclass
class Side:
    ref: str
    kind: str  # image | venv | manifest | record
    manifest: dict[str, Any] = field(repr=False)
    labels: dict[str, str] | None = None
    id: str | None = None
    reader: str | None = None

    def header(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("manifest", "labels")}
        torch = self.manifest.get("torch") or {}
        out["fingerprint"] = self.manifest.get("fingerprint")
        out["torch"] = {k: torch.get(k) for k in ("__version__", "cuda", "git_version")}
        return out


def add_diff_arguments(parser: argparse.ArgumentParser, images: bool) -> None:
    what = "image ref, venv directory or manifest file" if images else "manifest file or venv"
    parser.add_argument("a", metavar="A", help=what)
    parser.add_argument("b", metavar="B", help=what)
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")
    if images:
        parser.add_argument(
            "--engine",
            default="auto",
            choices=("auto", "docker", "podman", "buildah"),
            help="how to read images (default: DFLASH_ENGINE, else docker's API if it "
            "answers, else podman, else buildah)",
        )


def _from_json(ref: str, path: Path) -> Side:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(ref, f"not a JSON manifest: {exc}") from None
    if isinstance(data, dict) and "fingerprint" in data and "distributions" in data:
        return Side(ref, "manifest", data)
    env = data.get("environment") if isinstance(data, dict) else None
    if isinstance(env, dict) and isinstance(env.get("manifest"), dict):
        image = env.get("image") or {}
        labels = image.get("labels") if image else None
        return Side(ref, "record", env["manifest"], labels, image.get("id"))
    raise BadInput(ref, "neither a manifest (`dflash env manifest`) nor a bench record")


def _from_venv(ref: str, path: Path) -> Side:
    from .collect import ProbeError
    from .doctor import environment_manifest

    if not (path / "bin" / "python").exists():
        raise BadInput(ref, "is a directory but not a venv (no bin/python)")
    try:
        return Side(ref, "venv", environment_manifest(str(path)))
    except ProbeError as exc:
        raise BadInput(ref, f"cannot probe its interpreter: {exc}") from None


def load_side(ref: str, images: bool, engine: str = "auto") -> Side:
    path = Path(ref)
    if path.is_file():
        return _from_json(ref, path)
    if path.is_dir():
        return _from_venv(ref, path)
    if not images:
        raise BadInput(ref, "no such file or directory")
    info = inspect(ref, choose_reader(engine))
    return Side(ref, "image", image_manifest(info), info.labels, info.id, info.reader)


def compare(a: Side, b: Side) -> dict[str, Any]:
    diff = diff_manifests(a.manifest, b.manifest)
    labels = None if a.labels is None or b.labels is None else diff_maps(a.labels, b.labels)
    label_diff = bool(labels and any(labels.values()))
    return {
        "differ": differs(diff) or label_diff,
        "a": a.header(),
        "b": b.header(),
        "labels": labels,
        "manifest": diff,
    }


def _torch(h: dict[str, Any]) -> str:
    t = h["torch"]
    if not t.get("__version__"):
        return "no torch"
    build = [f"CUDA {t.get('cuda')}"] + (
        [f"git {t['git_version'][:12]}"] if t.get("git_version") else []
    )
    return f"torch {t['__version__']} ({', '.join(build)})"


def render(result: dict[str, Any]) -> list[str]:
    lines = []
    for name in ("a", "b"):
        h = result[name]
        ident = f"{h['kind']} {h['id'][:19]}" if h["id"] else h["kind"]  # sha256: + 12
        via = f" via {h['reader']}" if h["reader"] else ""
        lines.append(f"{name.upper()}: {h['ref']} ({ident}{via}), {_torch(h)}")
    body = summarize_diff(result["manifest"], limit=LIMIT)
    labels = result["labels"] or {}
    for key, val in labels.get("added", {}).items():
        body.append(f"label: + {key}={val}")
    for key, val in labels.get("removed", {}).items():
        body.append(f"label: - {key}={val}")
    for key, change in labels.get("changed", {}).items():
        body.append(f"label: ~ {key} {change['from']} -> {change['to']}")
    if result["labels"] is None:
        body.append("labels: not compared (one side is not an image)")
    if not result["differ"]:
        lines.append(f"identical: fingerprint {result['a']['fingerprint']}")
        return lines + [line for line in body if line.startswith("labels:")]
    return lines + (body or ["fingerprints differ"])


def run_diff(args: argparse.Namespace, prog: str, images: bool) -> int:
    try:
        engine = getattr(args, "engine", "auto")
        a = load_side(args.a, images, engine)
        b = load_side(args.b, images, engine)
    except (BadInput, RuntimeError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    result = compare(a, b)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print("\n".join(render(result)))
    return 1 if result["differ"] else 0
