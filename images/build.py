#!/usr/bin/env python3
"""Immutable per-CUDA-toolkit images for dflash: base, content key, build, smoke, removal.

Standard library only, so it runs with the system Python before any venv exists.

  python3 images/build.py base [--refresh]      Debian base image from debootstrap
  python3 images/build.py key VARIANT [-v]      print the content key (-v: every input)
  python3 images/build.py tag VARIANT           print the image tag for the current sources
  python3 images/build.py build VARIANT [--no-smoke] [--no-pointers]
  python3 images/build.py rm VARIANT [--all] [--base] [--cache] [--force]

An image is named by its content key: sha256 over the variant, the base image id,
the Dockerfile, .dockerignore and every file the Dockerfile copies (pyproject.toml,
uv.lock, README.md, dflash/). `build` tags `IMAGE:VARIANT-KEY16`, then moves the
pointers `IMAGE:VARIANT` and `IMAGE:latest`. An existing key tag is never rebuilt
or re-pointed: if it already carries this key the build does nothing, and if it
carries anything else the build refuses.

Environment:
  DFLASH_ENGINE      docker | podman (default: docker if its daemon answers and is not
                     podman's API socket, else podman)
  DFLASH_ISOLATION   podman/buildah isolation (default: chroot, which builds on hosts
                     where podman cannot run containers); ignored by docker
  DFLASH_BASE        base image reference (default: dflash-base:bookworm, see `base`)
  DFLASH_IMAGE       image repository name (default: dflash)
  DFLASH_CA_BUNDLE   PEM bundle passed as build secret `dflash_ca` for TLS-intercepting
                     proxies (never stored in the image)
  DFLASH_MIRROR      Debian mirror for `base` (default: http://deb.debian.org/debian)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("cu128", "cu130")
KEY_SCHEMA = "dflash-image-key/1"
KEY_TAG_LEN = 16  # hex digits of the key in the tag; the full key is in a label

# What the Dockerfile copies into the image, hence what the key hashes. The
# .dockerignore whitelists exactly these; tests/test_images.py keeps them in step.
KEY_FILES = ("pyproject.toml", "uv.lock", "README.md")
KEY_DIRS = ("dflash",)
IGNORED_DIR_NAMES = frozenset({"__pycache__"})
IGNORED_SUFFIXES = (".pyc", ".pyo")

DEFAULT_BASE = "dflash-base:bookworm"
BASE_SUITE = "bookworm"
# OS packages of the base: everything the Dockerfile needs, so that the build never
# runs apt and the base image id pins every OS package. python3.11-venv (ensurepip)
# bootstraps the pinned uv; gcc, libc6-dev and python3.11-dev are for Triton/inductor.
BASE_PACKAGES = (
    "python3.11",
    "python3.11-venv",
    "python3.11-dev",
    "gcc",
    "libc6-dev",
    "ca-certificates",
)

LABEL_KEY = "dev.dflash.content-key"
BASE_LABEL = "dev.dflash.base.suite"  # set by `base`, inherited by every image built on it
UV_CACHE_ID = "dflash-uv"  # the Dockerfile's uv cache mount id
LABEL_VARIANT = "dev.dflash.cuda-variant"


class BuildError(RuntimeError):
    pass


# --------------------------------------------------------------------------- key


def dockerfile_for(variant: str, root: Path = ROOT) -> Path:
    if variant not in VARIANTS:
        raise BuildError(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
    return root / f"Dockerfile.{variant}"


def _ignored(rel: Path) -> bool:
    return any(p in IGNORED_DIR_NAMES for p in rel.parts) or rel.name.endswith(IGNORED_SUFFIXES)


def key_inputs(root: Path, variant: str) -> list[tuple[str, Path]]:
    """(role, path) of every file the key covers, in a fixed order."""
    out = [("dockerfile", dockerfile_for(variant, root)), ("file", root / ".dockerignore")]
    out += [("file", root / name) for name in KEY_FILES]
    for d in KEY_DIRS:
        files = [
            p for p in (root / d).rglob("*") if p.is_file() and not _ignored(p.relative_to(root))
        ]
        out += [("file", p) for p in sorted(files, key=lambda p: p.relative_to(root).as_posix())]
    for _, p in out:
        if not p.is_file():
            raise BuildError(f"missing build input {p}")
    return out


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def key_lines(root: Path, variant: str, base_id: str) -> list[str]:
    """The canonical text the key is the sha256 of (printed by `key -v`)."""
    lines = [KEY_SCHEMA, f"variant {variant}", f"base {normalize_id(base_id)}"]
    for role, p in key_inputs(root, variant):
        # The Dockerfile is hashed by content under a fixed role name, so a
        # variant's key does not depend on the other variant's file.
        name = "Dockerfile" if role == "dockerfile" else p.relative_to(root).as_posix()
        lines.append(f"{role} {name} {_sha256_file(p)}")
    return lines


def content_key(root: Path, variant: str, base_id: str) -> str:
    blob = "\n".join(key_lines(root, variant, base_id)) + "\n"
    return hashlib.sha256(blob.encode()).hexdigest()


def normalize_id(image_id: str) -> str:
    image_id = image_id.strip()
    if not image_id:
        raise BuildError("empty base image id")
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"


def key_tag(image: str, variant: str, key: str) -> str:
    return f"{image}:{variant}-{key[:KEY_TAG_LEN]}"


# ------------------------------------------------------------------------ engine


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, **kw)


def detect_engine() -> str:
    chosen = os.environ.get("DFLASH_ENGINE", "").strip()
    if chosen:
        if chosen not in ("docker", "podman"):
            raise BuildError(f"DFLASH_ENGINE={chosen!r}: docker or podman")
        if not shutil.which(chosen):
            raise BuildError(f"DFLASH_ENGINE={chosen} but `{chosen}` is not installed")
        return chosen
    if shutil.which("docker"):
        ok = _run(["docker", "info"], capture_output=True).returncode == 0
        # DOCKER_HOST may point the docker CLI at podman's API socket (docker-py uses
        # one, e.g. `dflash bench run --image`): that engine is podman, so is the CLI.
        if ok and not (shutil.which("podman") and _docker_is_podman()):
            return "docker"
    if shutil.which("podman"):
        return "podman"
    raise BuildError("no container engine: install docker or podman (DFLASH_ENGINE=...)")


def _docker_is_podman() -> bool:
    r = _run(
        ["docker", "version", "--format", "{{range .Server.Components}}{{.Name}};{{end}}"],
        capture_output=True,
    )
    return "Podman" in r.stdout


class Engine:
    def __init__(self, name: str | None = None):
        self.name = name or detect_engine()

    def cmd(self, *args: str) -> list[str]:
        return [self.name, *args]

    def image_id(self, ref: str) -> str | None:
        r = _run(self.cmd("image", "inspect", "--format", "{{.Id}}", ref), capture_output=True)
        if r.returncode != 0 or not r.stdout.strip():
            return None
        return normalize_id(r.stdout.strip().splitlines()[0])

    def labels(self, ref: str) -> dict[str, str]:
        r = _run(
            self.cmd("image", "inspect", "--format", "{{json .Config.Labels}}", ref),
            capture_output=True,
        )
        if r.returncode != 0:
            raise BuildError(f"cannot inspect {ref}: {r.stderr.strip()}")
        return json.loads(r.stdout.strip().splitlines()[0] or "null") or {}

    def size(self, ref: str) -> int | None:
        r = _run(self.cmd("image", "inspect", "--format", "{{.Size}}", ref), capture_output=True)
        try:
            return int(r.stdout.strip().splitlines()[0])
        except (ValueError, IndexError):
            return None

    def tag(self, image_id: str, ref: str) -> None:
        check(self.cmd("tag", image_id, ref))

    def untag_or_remove(self, ref: str) -> None:
        """Remove one name; the image goes when its last name does."""
        _run(self.cmd("rmi", ref), capture_output=True)

    def tags_of_repo(self, repo: str) -> list[str]:
        r = _run(
            self.cmd("images", "--format", "{{.Repository}}:{{.Tag}}", repo),
            capture_output=True,
        )
        return [t for t in r.stdout.split() if not t.endswith(":<none>")]

    def build_flags(self) -> list[str]:
        if self.name == "podman":
            return ["--isolation", os.environ.get("DFLASH_ISOLATION", "chroot"), "--layers"]
        return []

    def build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.name == "docker":
            env["DOCKER_BUILDKIT"] = "1"  # secrets and cache mounts need BuildKit
        return env


def check(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+ " + " ".join(cmd), flush=True)
    r = _run(cmd, **kw)
    if r.returncode != 0:
        raise BuildError(f"command failed ({r.returncode}): {' '.join(cmd)}")
    return r


def short_name(ref: str) -> str:
    """podman prefixes local names with localhost/; compare names without it."""
    return ref.removeprefix("localhost/")


# -------------------------------------------------------------------------- base


def cmd_base(args: argparse.Namespace) -> int:
    eng = Engine()
    ref = os.environ.get("DFLASH_BASE", DEFAULT_BASE)
    existing = eng.image_id(ref)
    if existing and not args.refresh:
        print(f"base {ref} exists: {existing} (`just base --refresh` rebuilds it)")
        return 0
    if not shutil.which("debootstrap"):
        raise BuildError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise BuildError("debootstrap needs root")
    mirror = os.environ.get("DFLASH_MIRROR", "http://deb.debian.org/debian")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dflash-base-", dir=os.environ.get("TMPDIR")) as tmp:
        rootfs = Path(tmp) / "rootfs"
        check(
            [
                "debootstrap",
                "--variant=minbase",
                BASE_SUITE,
                str(rootfs),
                mirror,
            ]
        )
        # Security and point-release updates and the packages, then drop apt's caches.
        # (debootstrap --include fails to configure python3.11-venv, apt does not.)
        (rootfs / "etc/apt/sources.list").write_text(
            f"deb {mirror} {BASE_SUITE} main\n"
            f"deb {mirror} {BASE_SUITE}-updates main\n"
            f"deb {mirror.replace('/debian', '/debian-security')} {BASE_SUITE}-security main\n"
        )
        env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        check(["chroot", str(rootfs), "apt-get", "update", "-q"], env=env)
        check(["chroot", str(rootfs), "apt-get", "-y", "-q", "upgrade"], env=env)
        check(
            ["chroot", str(rootfs), "apt-get", "install", "-y", "-q", "--no-install-recommends"]
            + list(BASE_PACKAGES),
            env=env,
        )
        check(["chroot", str(rootfs), "apt-get", "clean"], env=env)
        for d in ("var/lib/apt/lists", "var/cache/apt", "var/log", "tmp"):
            for p in (rootfs / d).glob("*"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        changes = [
            "ENV LANG=C.UTF-8",
            'CMD ["/bin/bash"]',
            f"LABEL org.opencontainers.image.created={created}",
            "LABEL org.opencontainers.image.title=dflash-base",
            f"LABEL {BASE_LABEL}={BASE_SUITE}",
            f"LABEL dev.dflash.base.mirror={mirror}",
            f"LABEL dev.dflash.base.packages={','.join(BASE_PACKAGES)}",
        ]
        import_cmd = [eng.name, "import"]
        for c in changes:
            import_cmd += ["--change", c]
        import_cmd += ["-", ref]
        print("+ tar -C ROOTFS -c . | " + " ".join(import_cmd), flush=True)
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        )
        r = _run(import_cmd, stdin=tar.stdout, capture_output=True)
        assert tar.stdout is not None  # stdout=PIPE
        tar.stdout.close()
        if tar.wait() != 0 or r.returncode != 0:
            raise BuildError(f"import failed: {r.stderr.strip()}")
    new_id = eng.image_id(ref)
    print(f"base {ref}: {new_id} ({time.monotonic() - t0:.0f} s, {_gb(eng.size(ref))})")
    if existing and existing != new_id:
        print(f"previous base {existing} keeps its pin tag if an image was built on it")
    return 0


# ------------------------------------------------------------------------- build


def _git(*args: str) -> str:
    r = _run(["git", "-C", str(ROOT), *args], capture_output=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def source_and_revision() -> tuple[str, str, bool]:
    source = _git("config", "--get", "remote.origin.url") or f"file://{ROOT}"
    revision = _git("rev-parse", "HEAD") or "none"
    paths = [".dockerignore", *KEY_FILES, *KEY_DIRS, *(f"Dockerfile.{v}" for v in VARIANTS)]
    dirty = bool(_git("status", "--porcelain", "--", *paths))
    return source, revision, dirty


def _gb(n: int | None) -> str:
    return "size unknown" if n is None else f"{n / 1e9:.2f} GB"


def resolve_base(eng: Engine) -> tuple[str, str]:
    """(base reference, base image id). The id is pinned under a tag derived from
    it: BuildKit cannot build FROM a bare image id, and the tag keeps a replaced
    base alive so that older keys can still be rebuilt."""
    ref = os.environ.get("DFLASH_BASE", DEFAULT_BASE)
    base_id = eng.image_id(ref)
    if base_id is None:
        raise BuildError(f"base image {ref} not found: run `just base` (or set DFLASH_BASE)")
    return ref, base_id


def pin_ref(base_id: str) -> str:
    return f"dflash-base:{base_id.replace(':', '-')}"


def build_args(variant: str, key: str, base_ref: str, base_id: str) -> list[str]:
    source, revision, dirty = source_and_revision()
    lock_sha = _sha256_file(ROOT / "uv.lock")
    out = []
    for k, v in {
        "BASE_IMAGE": pin_ref(base_id),
        "BASE_NAME": base_ref,
        "BASE_DIGEST": base_id,
        "SOURCE": source,
        "REVISION": revision,
        "DIRTY": "true" if dirty else "false",
        "LOCK_SHA256": lock_sha,
        "CONTENT_KEY": key,
    }.items():
        out += ["--build-arg", f"{k}={v}"]
    return out


def secret_args() -> list[str]:
    ca = os.environ.get("DFLASH_CA_BUNDLE", "").strip()
    if not ca:
        return []
    if not Path(ca).is_file():
        raise BuildError(f"DFLASH_CA_BUNDLE={ca} is not a file")
    return ["--secret", f"id=dflash_ca,src={Path(ca).resolve()}"]


def _build(
    eng: Engine, variant: str, target: str, args: list[str], ctx: Path, iidfile: Path
) -> str:
    cmd = eng.cmd(
        "build",
        *eng.build_flags(),
        "-f",
        str(dockerfile_for(variant, ctx)),
        "--target",
        target,
        "--iidfile",
        str(iidfile),
        *args,
        *secret_args(),
        str(ctx),
    )
    t0 = time.monotonic()
    check(cmd, env=eng.build_env())
    print(f"built target {target} in {time.monotonic() - t0:.0f} s", flush=True)
    return normalize_id(iidfile.read_text())


def existing_key_image(eng: Engine, tag: str, key: str) -> str | None:
    """Id of `tag` if it is this key's image; None if absent; refuses otherwise."""
    image_id = eng.image_id(tag)
    if image_id is None:
        return None
    found = eng.labels(tag).get(LABEL_KEY)
    if found != key:
        raise BuildError(
            f"refusing: {tag} exists and holds other content ({LABEL_KEY}={found!r}, "
            f"expected {key}); a key tag is never moved. Remove it by hand if it is bogus."
        )
    return image_id


def move_pointers(eng: Engine, image: str, variant: str, image_id: str) -> list[str]:
    moved = []
    for ref in (f"{image}:{variant}", f"{image}:latest"):
        if eng.image_id(ref) != image_id:
            eng.tag(image_id, ref)
            moved.append(ref)
    return moved


def snapshot_context(variant: str, dest: Path, root: Path = ROOT) -> Path:
    """Copy exactly the key inputs into `dest`: the build reads this snapshot, so the
    image holds what its key names even if the checkout changes during the build."""
    for _, path in key_inputs(root, variant):
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest


def cmd_build(args: argparse.Namespace) -> int:
    eng = Engine()
    image = os.environ.get("DFLASH_IMAGE", "dflash")
    base_ref, base_id = resolve_base(eng)
    with tempfile.TemporaryDirectory(prefix="dflash-build-") as tmp:
        ctx = snapshot_context(args.variant, Path(tmp) / "context")
        key = content_key(ctx, args.variant, base_id)
        tag = key_tag(image, args.variant, key)
        have = existing_key_image(eng, tag, key)
        if have is None:
            if eng.image_id(pin_ref(base_id)) is None:
                eng.tag(base_id, pin_ref(base_id))
            bargs = build_args(args.variant, key, base_ref, base_id)
            built = _build(eng, args.variant, "runtime", bargs, ctx, Path(tmp) / "iid")
            smoke = None
            if not args.no_smoke:
                smoke = _build(eng, args.variant, "smoke", bargs, ctx, Path(tmp) / "smoke-iid")
                print("smoke stage passed", flush=True)
            # Re-check just before tagging: a concurrent build may have taken the tag.
            if existing_key_image(eng, tag, key) is None:
                eng.tag(built, tag)
            have = eng.image_id(tag)
            if have is None:
                raise BuildError(f"{tag} vanished right after tagging (removed concurrently?)")
            # Only now: removing the untagged smoke image also removes its untagged
            # parents, the runtime image among them until it has a name.
            if smoke is not None and smoke != built:
                eng.untag_or_remove(smoke)
            print(f"built {tag} ({have}, {_gb(eng.size(tag))})")
        else:
            print(f"up to date: {tag} ({have}) already holds content key {key}")
    if not args.no_pointers:
        moved = move_pointers(eng, image, args.variant, have)
        if moved:
            print(f"moved {', '.join(moved)} -> {tag}")
    print(tag)
    return 0


def cmd_key(args: argparse.Namespace) -> int:
    eng = Engine()
    _, base_id = resolve_base(eng)
    if args.verbose:
        print("\n".join(key_lines(ROOT, args.variant, base_id)))
    print(content_key(ROOT, args.variant, base_id))
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    eng = Engine()
    _, base_id = resolve_base(eng)
    image = os.environ.get("DFLASH_IMAGE", "dflash")
    print(key_tag(image, args.variant, content_key(ROOT, args.variant, base_id)))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove this variant's images: the current key tag and the pointers to it, or
    with --all every key tag of the variant. --base also removes the base and its
    pin tags; --cache the untagged layers built on a dflash base and the uv cache
    mount. Only names this tool creates are touched."""
    eng = Engine()
    image = os.environ.get("DFLASH_IMAGE", "dflash")
    base_ref = os.environ.get("DFLASH_BASE", DEFAULT_BASE)
    base_id = eng.image_id(base_ref)
    prefix = f"{image}:{args.variant}-"
    names = [short_name(t) for t in eng.tags_of_repo(image)]
    if args.all:
        targets = [t for t in names if t.startswith(prefix)]
    elif base_id is None:
        raise BuildError(f"base {base_ref} not found, so the current key is unknown: use --all")
    else:
        targets = [key_tag(image, args.variant, content_key(ROOT, args.variant, base_id))]
    ids = {i for i in (eng.image_id(t) for t in targets) if i is not None}
    refuse_baseline_images(ids, args.force)
    for ref in (f"{image}:{args.variant}", f"{image}:latest"):
        if eng.image_id(ref) in ids:
            targets.append(ref)
    for t in targets:
        if eng.image_id(t) is not None:
            print(f"removing {t}")
            eng.untag_or_remove(t)
    if args.cache:
        # Untagged build layers descend from a dflash base, whose label they inherit.
        print(f"removing untagged build layers ({BASE_LABEL})")
        _run(eng.cmd("image", "prune", "-f", "--filter", f"label={BASE_LABEL}"))
        for d in uv_cache_mount_dirs(eng):
            print(f"removing uv cache mount {d}")
            shutil.rmtree(d, ignore_errors=True)
    if args.base:  # last: the layers above are built on it
        for t in (short_name(x) for x in eng.tags_of_repo("dflash-base")):
            print(f"removing {t}")
            eng.untag_or_remove(t)
    return 0


def refuse_baseline_images(ids: set[str], force: bool) -> None:
    """An accepted bench baseline's image is what `dflash bench run --image` measures
    beside the next candidate: removing it must be said out loud (--force)."""
    sys.path.insert(0, str(ROOT))
    from dflash.bench.store import baseline_images, default_root

    kept = {i: keys for i, keys in baseline_images().items() if i in ids}
    if kept and not force:
        image_id, keys = next(iter(kept.items()))
        raise BuildError(
            f"image {image_id[:19]} is the accepted bench baseline of {', '.join(keys)} (store "
            f"{default_root()}): --force removes it anyway (paired image benches of that key "
            "then fall back to the stored numbers)"
        )


def uv_cache_mount_dirs(eng: Engine) -> list[Path]:
    """Where buildah keeps the Dockerfile's `id=dflash-uv` cache mount (podman only;
    `docker builder prune` manages Docker's)."""
    if eng.name != "podman":
        return []
    tmp = Path(os.environ.get("TMPDIR", "/var/tmp"))
    candidates = [
        tmp / "buildah-cache" / UV_CACHE_ID,
        tmp / f"buildah-cache-{os.getuid()}" / UV_CACHE_ID,
    ]
    return [d for d in candidates if d.is_dir()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="images/build.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("base", help="build the Debian base image with debootstrap")
    b.add_argument("--refresh", action="store_true", help="rebuild even if it exists")
    for name, fn_help in (
        ("key", "print the content key"),
        ("tag", "print the key tag"),
        ("build", "build, smoke-test and tag an image"),
        ("rm", "remove images this tool built"),
    ):
        s = sub.add_parser(name, help=fn_help)
        s.add_argument("variant", choices=VARIANTS)
        if name == "key":
            s.add_argument("-v", "--verbose", action="store_true", help="print every input")
        if name == "build":
            s.add_argument("--no-smoke", action="store_true", help="skip the smoke stage")
            s.add_argument("--no-pointers", action="store_true", help="do not move pointers")
        if name == "rm":
            s.add_argument("--all", action="store_true", help="every key tag of the variant")
            s.add_argument("--base", action="store_true", help="also the base image")
            s.add_argument(
                "--force", action="store_true", help="even an accepted bench baseline's image"
            )
            s.add_argument(
                "--cache",
                action="store_true",
                help="also untagged build layers and the uv cache mount",
            )
    args = p.parse_args(argv)
    fn = {"base": cmd_base, "key": cmd_key, "tag": cmd_tag, "build": cmd_build, "rm": cmd_rm}
    try:
        return fn[args.cmd](args)
    except BuildError as exc:
        print(f"images/build.py {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
