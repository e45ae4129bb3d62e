"""The package's import structure: every module imports on its own in a fresh interpreter,
and the import graph (function-local imports included) has no cycle.

A cycle hidden behind a function-local import works until someone moves the import to the
top or calls the function during the other module's import; grimp reads every import
statement of every module (not just the top-level ones) and networkx finds the cycles.
"""

from __future__ import annotations

import json
import subprocess
import sys

import grimp
import networkx as nx

# Modules that run a program when imported (`python -m dflash`), not libraries.
ENTRY_POINTS = {"dflash.__main__"}


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("dflash", exclude_type_checking_imports=True)


def test_every_module_imports_alone_in_a_fresh_interpreter():
    modules = sorted(_graph().modules - ENTRY_POINTS)
    script = (
        "import importlib, json, sys, traceback\n"
        "bad = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        bad[name] = traceback.format_exc(limit=3)\n"
        "print(json.dumps(bad))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(modules)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not bad, "\n".join(f"{k}:\n{v}" for k, v in bad.items())
    assert len(modules) > 90  # the walk saw the package, not an empty namespace


def test_no_import_cycles():
    g = _graph()
    edges = nx.DiGraph()
    for module in g.modules:
        for imported in g.find_modules_directly_imported_by(module):
            edges.add_edge(module, imported)
    cycles = [" -> ".join([*c, c[0]]) for c in nx.simple_cycles(edges)]
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))
    # The check sees function-local imports: train_cli imports launch inside main().
    assert "dflash.distributed.launch" in g.find_modules_directly_imported_by("dflash.train_cli")
