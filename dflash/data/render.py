"""Render a conversation with the tokenizer's chat template and mark assistant tokens.

The loss mask must match what the target produces at serve time: the assistant's
content plus its end-of-turn token (`<|im_end|>` in ChatML), but not the role
header the template writes before it, nor the newline after it. Spans are found on
the rendered *text*, template-agnostically:

    before = render(messages[:i], add_generation_prompt=True)   # ...<|im_start|>assistant\\n
    upto   = render(messages[:i + 1])                           # ...content<|im_end|>\\n
    span   = [len(before), len(upto.rstrip()))

which needs the template to be prefix-consistent (rendering a longer conversation
never rewrites an earlier part); that is checked, not assumed. Character spans
become token masks through the fast tokenizer's offset mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash.data.sources import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _apply(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], generation_prompt: bool
) -> str:
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as e:  # jinja errors, template-raised exceptions
        raise DataError(
            f"chat template failed on {len(messages)} message(s) "
            f"(roles {[m['role'] for m in messages]}): {e}"
        ) from None
    if not isinstance(text, str):
        raise DataError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def assistant_char_spans(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> tuple[str, list[tuple[int, int]]]:
    """Full rendered text and the [start, end) character span of each assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} "
            "has no chat template. Use the target model's own tokenizer (one that ships a "
            "chat_template), or set tokenizer.chat_template to a Jinja template."
        )
    full = _apply(tokenizer, messages, generation_prompt=False)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _apply(tokenizer, messages[:i], generation_prompt=True)
        upto = _apply(tokenizer, messages[: i + 1], generation_prompt=False)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise DataError(
                f"chat template is not prefix-consistent at message {i} (assistant): "
                "rendering a longer conversation changes the text of earlier turns "
                "(e.g. a template that strips reasoning from past turns), so assistant "
                "spans cannot be located. Use single-turn samples or a template where "
                "render(messages[:i]) is a prefix of render(messages[:i+1])."
            )
        spans.append((len(before), len(upto.rstrip())))
    return full, spans


def render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> tuple[list[int], list[int]]:
    """Tokenize a conversation; returns (input_ids, loss_mask) of equal length.

    loss_mask[t] = 1 for tokens overlapping an assistant span (content and end-of-turn
    token), else 0. Needs a fast tokenizer (offset mapping) with a chat template.
    """
    full, spans = assistant_char_spans(tokenizer, messages)
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"{type(tokenizer).__name__} is a slow tokenizer; render() needs offset "
            "mappings. Load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
        )
    # add_special_tokens=False: the template already wrote any BOS it wants.
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    mask = [0] * len(ids)
    k = 0  # spans and offsets are both ascending: one merged sweep
    for t, (s, e) in enumerate(enc["offset_mapping"]):
        while k < len(spans) and spans[k][1] <= s:
            k += 1  # span k ended before this token starts
        if k == len(spans):
            break
        a, b = spans[k]
        # Overlap of [s, e) with [a, b); an empty-offset token counts if it sits inside.
        if (s < b and e > a) or (s == e and a <= s < b):
            mask[t] = 1
    return ids, mask
