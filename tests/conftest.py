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
