"""Imported once by the repeat forkserver (see runner.py): the heavy imports only.

Nothing here may run a tensor op or start a thread pool: every repeat is forked
from this state and must start as fresh as a new process, minus the import time.
"""

from __future__ import annotations

import time

_t0 = time.perf_counter()
import torch  # noqa: E402,F401
import transformers.models.qwen3.modeling_qwen3  # noqa: E402,F401

import dflash.bench.build  # noqa: E402,F401
import dflash.data.tokenizer  # noqa: E402,F401
import dflash.loop  # noqa: E402,F401

IMPORT_S = time.perf_counter() - _t0
