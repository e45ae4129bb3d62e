import os

import pytest
import torch

# CPU tests on a 2-core machine: one intra-op thread keeps parallel test processes
# from oversubscribing the cores and keeps float results reproducible.
torch.set_num_threads(1)
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def tiny_qwen3_config():
    from transformers import Qwen3Config

    from dflash.config import TINY_TARGET

    # The tiny preset's target shapes, with a small vocabulary and no padded rows.
    return Qwen3Config(vocab_size=128, tie_word_embeddings=False, **TINY_TARGET)


_ENVIRON_AT_START = dict(os.environ)


def _restore(saved: dict[str, str]) -> None:
    for k in set(os.environ) - set(saved):
        del os.environ[k]
    os.environ.update(saved)


def pytest_collection_finish(session) -> None:
    # Importing the test modules compiles (dflash.visibility), which sets inductor's
    # default TORCHINDUCTOR_CACHE_DIR in os.environ: undo what collection set.
    _restore(_ENVIRON_AT_START)


@pytest.fixture(autouse=True)
def _environ_restored():
    """Each test leaves os.environ as it found it. In-process code sets variables for
    the rest of the process (torch's inductor writes its default TORCHINDUCTOR_CACHE_DIR
    the first time it compiles; the trainer keys the compile caches), and a later test's
    subprocess would inherit them: the doctor then saw an unkeyed compile cache in a
    clean environment, depending on test order."""
    saved = dict(os.environ)
    yield
    _restore(saved)
