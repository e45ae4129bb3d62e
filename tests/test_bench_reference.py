"""The machine-speed reference: fixed work, and nothing the audited environment owns.

No assertion on speed: that it tracks the host is measured by bench/stat_quality.py.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

from dflash.bench.reference import _COPY_BYTES, REF_NOMINAL_S, Reference, corrected


def test_the_same_work_every_run():
    a, b = Reference(), Reference()
    assert a.kernel() == a.kernel() == b.kernel()
    assert a._dst == a._src  # the copy really happened
    assert a.run() > 0


def test_kernel_allocates_a_small_fraction_of_what_it_copies():
    # A large allocation per run would make the reference slow down under allocator
    # settings (MALLOC_PERTURB_, PYTHONMALLOC=debug) that also slow the workload, and
    # so hide them. bytes(buffer) or a slice assignment from bytes allocated 32 MiB.
    ref = Reference()
    ref.kernel()
    tracemalloc.start()
    try:
        ref.kernel()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < _COPY_BYTES / 8, f"reference kernel allocated {peak} bytes"


def test_reference_needs_no_torch_numpy_or_python_level_loop():
    # With torch and numpy made unimportable, and a line tracer installed that counts
    # every Python line run while the kernel runs: only the kernel's own few lines.
    code = """
import sys
sys.modules["torch"] = None
sys.modules["numpy"] = None
from dflash.bench.reference import Reference
ref = Reference()
lines = []
def tracer(frame, event, arg):
    if event == "line":
        lines.append(frame.f_code.co_name)
    return tracer
sys.settrace(tracer)
ref.kernel()
sys.settrace(None)
print(len(lines))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) <= 6, out.stdout


def test_correction_scales_to_the_nominal_host():
    assert corrected(1000.0, REF_NOMINAL_S, 2.0) == 1000.0
    # A host on which the reference takes 10% longer is slower: the raw figure is
    # scaled up, by 1.1 squared with power 2.
    assert abs(corrected(1000.0, REF_NOMINAL_S * 1.1, 2.0) - 1210.0) < 1e-9
