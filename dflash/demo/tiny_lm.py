"""Build the demo's target: a BPE tokenizer and a tiny Qwen3 LM trained on local text.

The result is an ordinary HF directory (config.json, model.safetensors, tokenizer
files with a ChatML chat_template, generation_config.json), loadable with
`AutoModelForCausalLM/AutoTokenizer.from_pretrained(dir, local_files_only=True)` by
transformers 5 and 4.57 alike (legacy rope keys, a tokenizer class both know),
so every later stage (regen, train, eval) treats it exactly like a downloaded target.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from dflash.data.tokenizer import IM_END, SPECIAL_TOKENS, save_tokenizer, wrap_chatml
from dflash.export import add_legacy_rope_keys


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained with `tokenizers`, wrapped as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False: the loss-mask renderer maps character spans through offsets.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return wrap_chatml(tok)


def target_config(tok, *, hidden: int, layers: int, max_len: int):
    from transformers import Qwen3Config

    # One padded row at least, rounded up to 64: the first padded row is the drafter's
    # mask token (an existing embedding row the tokenizer never produces).
    vocab = (len(tok) // 64 + 1) * 64
    heads = max(1, hidden // 32)
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=32,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
        eos_token_id=tok.convert_tokens_to_ids(IM_END),
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )


def pretrain(
    model,
    stream: torch.Tensor,
    *,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    seed: int,
) -> list[dict[str, float]]:
    """Next-token training on random windows of one long token stream (AdamW, cosine)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    log, t0 = [], time.perf_counter()
    model.train()
    bar = tqdm(range(steps), desc="demo target", unit="step", dynamic_ncols=True)
    for step in bar:
        scale = (
            (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * step / steps))
        )
        for g in opt.param_groups:
            g["lr"] = lr * max(scale, 0.05)
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
        x = torch.stack([stream[s : s + seq_len] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == steps - 1:
            log.append({"step": step + 1, "loss": loss.item(), "s": time.perf_counter() - t0})
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return log


def build_target(
    out_dir: Path,
    corpus: list[dict[str, str]],
    *,
    vocab_size: int,
    hidden: int,
    layers: int,
    steps: int,
    batch: int,
    seq_len: int,
    lr: float,
    seed: int,
) -> list[dict[str, float]]:
    """Train tokenizer and LM on the chat-rendered corpus; save an HF directory."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    tok = train_tokenizer([s["prompt"] + "\n" + s["response"] for s in corpus], vocab_size)
    texts = [
        tok.apply_chat_template(
            [
                {"role": "user", "content": s["prompt"]},
                {"role": "assistant", "content": s["response"]},
            ],
            tokenize=False,
        )
        for s in corpus
    ]
    docs = tok(texts, add_special_tokens=False)["input_ids"]
    stream = torch.tensor([t for doc in docs for t in doc], dtype=torch.long)
    cfg = target_config(tok, hidden=hidden, layers=layers, max_len=4 * seq_len)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    log = pretrain(model, stream, steps=steps, batch=batch, seq_len=seq_len, lr=lr, seed=seed)
    eos = [tok.convert_tokens_to_ids(IM_END), tok.eos_token_id]
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=tok.pad_token_id, do_sample=False
    )
    model.save_pretrained(out_dir)
    add_legacy_rope_keys(model.config, out_dir)  # transformers 4.x reads rope_theta only
    save_tokenizer(tok, out_dir)
    return log
