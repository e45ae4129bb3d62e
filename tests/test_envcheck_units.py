"""Pure pieces of dflash.envcheck: CUDA classification, fingerprint and diff,
probe helpers, GPU parsing, compile caches, report and preflight."""

import hashlib
import importlib
import json
import os
import stat
import subprocess
import sys

import pytest
from test_envcheck_fakes import SITE, context, dist, static

from dflash.envcheck import caches, probe, probe_gpu
from dflash.envcheck.cuda import cuda_major_of, decode_reasons, driver_verdict, torch_cuda_major
from dflash.envcheck.doctor import Report, run_doctor
from dflash.envcheck.doctor_report import render_human
from dflash.envcheck.findings import Finding
from dflash.envcheck.fingerprint import build_manifest, components_from_probe, fingerprint
from dflash.envcheck.manifest_diff import diff_manifests, summarize_diff

# The package exports the preflight *function* under the same name as its module.
preflight_mod = importlib.import_module("dflash.envcheck.preflight")


@pytest.mark.parametrize(
    ("name", "version", "dirs", "major"),
    [
        ("nvidia-cudnn-cu12", "9.10.2.21", (), 12),
        ("nvidia-cudnn-cu13", "9.26.0.51", (), 13),
        ("nvidia-cublas", "13.4.1.3", (), 13),
        ("nvidia-nvtx", "13.2.86", ("nvidia/cu13",), 13),
        ("nvidia-cufft", "12.2.0.57", ("nvidia/cu13",), 13),  # CUDA 13 cuFFT is version 12.x
        ("nvidia-cusolver", "12.2.0.11", (), None),  # unknown without its files
        ("cuda-toolkit", "13.2.2", (), 13),
        ("cuda-bindings", "12.9.4", (), 12),
        ("cuda-pathfinder", "1.9.1", (), None),
        ("nvidia-ml-py", "13.580.65", (), None),
    ],
)
def test_cuda_major_of(name, version, dirs, major):
    assert cuda_major_of(name, version, dirs) == major


def test_driver_verdicts_and_reasons():
    assert torch_cuda_major("12.8") == 12 and torch_cuda_major(None) is None
    assert driver_verdict("525.60.12", "12.8") == ("error", "525.60.13")
    assert driver_verdict("570.25", "12.8") == ("warning", "570.26")
    assert driver_verdict("570.26", "12.8") is None
    assert driver_verdict("590.1", "13.0") is None
    assert driver_verdict("575.57.08", "13.0") == ("error", "580.65.06")
    assert decode_reasons(0x24) == ["sw_power_cap", "sw_thermal_slowdown"]


def test_fingerprint_is_path_independent_and_sensitive():
    base = static([dist("torch", "2.10.0", libs=["torch/lib/libc10.so"])])
    moved = json.loads(json.dumps(base).replace("/env", "/elsewhere/venv"))
    fp = fingerprint(components_from_probe(base))
    assert fingerprint(components_from_probe(moved)) == fp
    per_rank = {**base, "variables": {"CUDA_VISIBLE_DEVICES": "3", "TORCHINDUCTOR_CACHE_DIR": "/x"}}
    assert fingerprint(components_from_probe(per_rank)) == fp
    # What a GPU container runtime sets per container is not the environment either.
    in_container = {**base, "variables": {"NVIDIA_VISIBLE_DEVICES": "all"}}
    assert fingerprint(components_from_probe(in_container)) == fp
    for variant in (
        {**base, "variables": {"LD_LIBRARY_PATH": "/opt/cuda"}},
        {**base, "variables": {"ATEN_CPU_CAPABILITY": "avx2"}},
        static([dist("torch", "2.10.0", libs=["torch/lib/libc10.so"]), dist("six", "1.17.0")]),
        static([dist("torch", "2.10.0", libs=["torch/lib/libc10.so"])], torch_cuda="13.0"),
    ):
        assert fingerprint(components_from_probe(variant)) != fp
    rebuilt = json.loads(json.dumps(base))
    rebuilt["libraries"][f"{SITE}/torch/lib/libc10.so"]["sha256_sampled"] = "other build"
    assert fingerprint(components_from_probe(rebuilt)) != fp
    holed = static([dist("torch", "2.10.0", missing=["torch/lib/libc10.so"])])
    assert components_from_probe(holed)["libraries"] == {
        "torch/lib/libc10.so": {"size": None, "sha256_sampled": None}
    }


def test_diff_manifests_reports_what_changed():
    a = build_manifest(static([dist("torch", "2.10.0"), dist("idna", "3.11")]), "cu128")
    b = build_manifest(
        static(
            [dist("torch", "2.10.0"), dist("idna", "3.10"), dist("six", "1.17.0")],
            variables={"NCCL_ALGO": "Ring"},
        ),
        "cu128",
    )
    d = diff_manifests(a, b)
    assert not d["same"] and d["changed_components"] == ["distributions", "variables"]
    assert d["distributions"]["added"] == {"six": "1.17.0"}
    assert d["distributions"]["changed"] == {"idna": {"from": "3.11", "to": "3.10"}}
    assert d["variables"]["added"] == {"NCCL_ALGO": "Ring"}
    assert "distributions: ~ idna 3.11 -> 3.10" in summarize_diff(d)
    assert diff_manifests(a, a)["same"] and diff_manifests(a, a)["changed_components"] == []


def test_probe_helpers(tmp_path):
    small = tmp_path / "libsmall.so.1"
    small.write_bytes(b"abc")
    assert probe.sampled_sha256(str(small), 3) == hashlib.sha256(b"3abc").hexdigest()
    big = tmp_path / "libbig.so"
    body = os.urandom(3 * probe.SAMPLE_BYTES)
    big.write_bytes(body)
    head_tail = body[: probe.SAMPLE_BYTES] + body[-probe.SAMPLE_BYTES :]
    want = hashlib.sha256(str(len(body)).encode() + head_tail).hexdigest()
    assert probe.sampled_sha256(str(big), len(body)) == want
    digest = probe.record_hash(str(small))
    claimants = [
        {"name": "a", "size": 3, "hash": "sha256=nope"},
        {"name": "b", "size": 3, "hash": digest},
        {"name": "c", "size": 9, "hash": "sha256=x"},
    ]
    assert probe.content_owner(str(small), 3, claimants) == "b"  # equal sizes: full hash decides
    assert probe.content_owner(str(small), 9, claimants) == "c"
    assert probe.content_owner(str(small), 5, claimants) is None
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.10.0+cu128'\ncuda: Optional[str] = '12.8'\n"
        "hip = None\ngit_version = compute()\n"
    )
    info = probe.torch_version_info(str(tmp_path))
    assert (info["__version__"], info["cuda"], info["hip"]) == ("2.10.0+cu128", "12.8", None)
    assert "git_version" not in info  # not a literal: skipped, never executed


FAKE_SMI = """#!/bin/sh
case "$1" in
  *clocks_event_reasons*) echo "Field is not a valid field to query." ; exit 2 ;;
esac
echo "NVIDIA H100 80GB HBM3, 535.104.05, 1980, 1980, 41, 70.5, 0x0000000000000001"
echo "NVIDIA H100 80GB HBM3, 535.104.05, 1410, 1980, 87, 699.1, 0x0000000000000044"
"""


def test_gpu_probe_parses_nvidia_smi_with_old_field_names(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    got = probe_gpu.via_smi()
    assert got["driver"] == "535.104.05"
    assert [(g["sm_clock_mhz"], g["reasons"]) for g in got["gpus"]] == [(1980.0, 1), (1410.0, 0x44)]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert probe_gpu.via_smi() is None


def test_configure_compile_caches(tmp_path, monkeypatch):
    fp = "ab" * 32
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    got = caches.configure_compile_caches(tmp_path / "root", fingerprint=fp)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "root" / fp / "inductor")
    assert (tmp_path / "root" / fp / "inductor").is_dir()
    assert got["user_set"] == ["TRITON_CACHE_DIR"]
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")  # the user's choice stands


def test_doctor_lists_caches_of_other_fingerprints(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "default_unkeyed_caches", lambda: [])
    st = static([dist("torch", "2.10.0")], variables={"TRITON_CACHE_DIR": "/tmp/shared-triton"})
    fp = fingerprint(components_from_probe(st))
    st["variables"]["TORCHINDUCTOR_CACHE_DIR"] = f"/elsewhere/{fp}/inductor"  # keyed: fine
    ctx = context(st, None, cache_root=tmp_path)
    for name, size in ((ctx.fingerprint, 10), ("cd" * 32, 4096), ("not-a-fingerprint", 1)):
        (tmp_path / name / "inductor").mkdir(parents=True)
        (tmp_path / name / "inductor" / "kernel.so").write_bytes(b"x" * size)
    findings = caches.check_caches(ctx)
    (other,) = [f for f in findings if f.code == "COMPILE_CACHE_OTHER"]
    assert [(c["path"], c["bytes"]) for c in other.details["caches"]] == [
        (str(tmp_path / ("cd" * 32)), 4096)
    ]
    (unkeyed,) = [f for f in findings if f.code == "COMPILE_CACHE_UNKEYED"]
    assert unkeyed.severity == "warning" and unkeyed.details["variable"] == "TRITON_CACHE_DIR"


def _report(*findings):
    return Report(python="/env/bin/python", findings=list(findings), fingerprint="f" * 64)


def test_report_exit_codes_and_fix_dedupe():
    err = Finding("error", "FILE_MISSING", "m1", "fix A")
    warn = Finding("warning", "LIB_SHADOW_COPY", "m2", "fix A")
    assert _report(warn).exit_code == 0 and _report(err, warn).exit_code == 1
    text = render_human(_report(err, warn))
    assert text.count("fix A") == 1 and "[fix 1]" in text and "NOT CLEAN (exit 1" in text
    with pytest.raises(ValueError, match="unknown finding code"):
        Finding("error", "NOT_A_CODE", "x")


def test_preflight_raises_or_banners(monkeypatch):
    err = Finding("error", "UNLOCKED_PACKAGE", "six 1.17.0 is installed", "recreate")
    monkeypatch.setattr(preflight_mod, "run_doctor", lambda *a, **k: _report(err))
    with pytest.raises(preflight_mod.DirtyEnvironment) as info:
        preflight_mod.preflight(False, log=lambda s: None)
    assert "six 1.17.0" in info.value.report and info.value.record["dirty"]
    logged = []
    record = preflight_mod.preflight(True, log=logged.append)
    assert record["dirty"] and record["fingerprint"] == "f" * 64
    assert "DIRTY ENVIRONMENT" in logged[0] and record["findings"][0]["code"] == "UNLOCKED_PACKAGE"
    monkeypatch.setattr(preflight_mod, "run_doctor", lambda *a, **k: _report())
    assert preflight_mod.preflight(False, log=logged.append)["dirty"] is False


def test_unusable_interpreter_is_a_finding_not_a_crash(tmp_path):
    report = run_doctor(str(tmp_path / "no-such-python"), import_torch=False)
    assert [f.code for f in report.findings] == ["PROBE_FAILED"] and report.exit_code == 1


@pytest.mark.slow
def test_doctor_process_never_imports_torch():
    code = (
        "import sys; from dflash.envcheck.doctor import run_doctor; "
        "r = run_doctor(import_torch=True); "
        "print(r.fingerprint != '' and 'torch' not in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "True", out.stderr
