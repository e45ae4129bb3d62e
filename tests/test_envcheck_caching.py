"""What keeps `dflash doctor --no-import` fast without changing what it finds: the
static probe's sampled-hash cache, the parsed-TOML cache, METADATA read by its
headers only, and a package import that lets the probes start first."""

import importlib.metadata
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from dflash.envcheck import lockfile, probe, probe_startup

REPO = Path(__file__).resolve().parents[1]


def _counting(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = probe.sampled_sha256

    def counted(path: str, size: int) -> str:
        calls.append(path)
        return real(path, size)

    monkeypatch.setattr(probe, "sampled_sha256", counted)
    return calls


def test_sample_cache_reuses_only_files_whose_stat_identity_held(tmp_path, monkeypatch):
    lib = tmp_path / "libx.so.1"
    lib.write_bytes(b"a" * 100)
    time.sleep(0.05)  # past the file-time clock's tick (a few ms)
    monkeypatch.setattr(probe, "RACY_NS", 0)
    calls = _counting(monkeypatch)
    cache = tmp_path / "cache" / "samples.json"
    first = probe.SampleCache(str(cache))
    want = first.sha(str(lib), os.stat(lib))
    first.save()
    assert cache.is_file() and calls == [str(lib)]
    again = probe.SampleCache(str(cache)).sha(str(lib), os.stat(lib))
    assert again == want and len(calls) == 1  # unchanged: read from the cache
    # Edited in place, same size, mtime put back: the ctime moved, so it is hashed again.
    st = os.stat(lib)
    time.sleep(0.05)
    lib.write_bytes(b"b" * 100)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(lib).st_mtime_ns == st.st_mtime_ns
    edited = probe.SampleCache(str(cache)).sha(str(lib), os.stat(lib))
    assert edited == probe.SampleCache(None).sha(str(lib), os.stat(lib)) != want
    assert len(calls) == 3


def test_sample_cache_skips_racy_files_and_bad_caches(tmp_path, monkeypatch):
    lib = tmp_path / "liby.so"
    lib.write_bytes(b"y" * 10)
    cache = tmp_path / "samples.json"
    fresh = probe.SampleCache(str(cache))
    fresh.sha(str(lib), os.stat(lib))  # changed within RACY_NS: hashed, not kept
    fresh.save()
    assert not cache.exists()
    cache.write_text("{not json")
    calls = _counting(monkeypatch)
    assert probe.SampleCache(str(cache)).sha(str(lib), os.stat(lib)) and len(calls) == 1


def test_static_probe_output_is_the_same_with_a_warm_cache(tmp_path):
    cache = tmp_path / "samples.json"
    runs = []
    for args in ([], [str(cache)], [str(cache)]):
        proc = subprocess.run(
            [sys.executable, "-I", probe.__file__, *args], capture_output=True, text=True
        )
        line = proc.stdout.strip().splitlines()[-1]
        runs.append(json.loads(line[len(probe.MARKER) :])["libraries"])
    assert cache.is_file() and runs[0] == runs[1] == runs[2] and runs[0]


def test_metadata_headers_match_importlib_metadata():
    for dist in importlib.metadata.distributions():
        full, heads = dist.metadata, probe.metadata_headers(dist)
        assert (heads["Name"], heads["Version"]) == (full["Name"], full["Version"])
        assert heads.get_all("Requires-Dist") == full.get_all("Requires-Dist")
        assert probe_startup.metadata_headers(dist)["Name"] == full["Name"]


def test_parsed_toml_cache_is_keyed_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_COMPILE_CACHE_ROOT", str(tmp_path / "compile"))
    text = (REPO / "uv.lock").read_text(encoding="utf-8")
    assert lockfile.load_toml(text) == tomllib.loads(text)  # parsed, then kept
    cached = lockfile.toml_cache_path(text)
    assert cached.is_file() and lockfile.load_toml(text) == tomllib.loads(text)
    edited = text.replace('version = "', 'version = "9', 1)
    assert lockfile.load_toml(edited) == tomllib.loads(edited) != tomllib.loads(text)
    cached.write_text("[broken")  # an unreadable copy is parsed afresh and replaced
    assert lockfile.load_toml(text) == tomllib.loads(text)
    assert json.loads(cached.read_text()) == tomllib.loads(text)


def test_package_import_leaves_the_doctor_for_after_the_probes_start():
    code = (
        "import sys, dflash.envcheck, dflash.envcheck.doctor_cli, dflash.envcheck.collect\n"
        "early = sorted(m for m in ('packaging', 'tomllib', 'dflash.envcheck.doctor') "
        "if m in sys.modules)\n"
        "from dflash.envcheck import preflight, run_doctor, diff_manifests, "
        "configure_compile_caches, environment_fingerprint\n"
        "print(early, callable(preflight), run_doctor.__module__, diff_manifests.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    want = "[] True dflash.envcheck.doctor dflash.envcheck.manifest_diff"
    assert out.stdout.strip() == want
