"""A tiny byte-level BPE tokenizer with a ChatML template, built offline for tests.

Everything is derived from constants in this file: the 256 byte tokens come first
(id == byte value), then NUM_MERGES merges learnt by a small pure-Python BPE on
CORPUS, then the three special tokens. The learner breaks ties on the pair's
strings, never on hash or dict order, so the vocabulary is byte-identical on every
machine. len() is 336: deliberately not a multiple of 64, so a model that rounds its
embedding rows up to a multiple of 64 always has padded rows beyond the tokenizer.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

NUM_MERGES = 77
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)

# ChatML. `add_generation_prompt` opens an assistant turn; every message closes with
# <|im_end|>\n so that rendering messages[:i] is a prefix of rendering messages[:i+1].
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Fixed training text for the merges: a little English and a little Python, the two
# kinds of text the tests render.
CORPUS = """\
The user asks a question and the assistant answers it. The assistant is helpful,
honest and short. When the answer is not known, the assistant says so and explains
what it would need to find out. A good answer restates the question, gives the
result, and then shows the steps that lead to the result.

user: What is the capital of France?
assistant: The capital of France is Paris.
user: How many days are there in a week?
assistant: There are seven days in a week.
user: Write a function that returns the sum of a list.
assistant: Here is a short function that does it:

def total(values):
    result = 0
    for value in values:
        result = result + value
    return result

user: Explain what the function does.
assistant: The function starts with a result of zero, then adds each value in the
list to the result, and finally returns the result to the caller.

Speculative decoding lets a small draft model propose several tokens that the large
target model then checks in a single forward pass. The target accepts the longest
prefix of the draft that matches its own greedy choice, and then adds one token of
its own. When the draft is good, many tokens are accepted in each step, and the text
is produced faster than by the target alone, with exactly the same output.

class Counter:
    def __init__(self, start=0):
        self.count = start

    def increment(self, step=1):
        self.count = self.count + step
        return self.count

for index in range(10):
    if index % 2 == 0:
        print("even", index)
    else:
        print("odd", index)
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _learn_merges(words: Counter[str], num_merges: int) -> list[tuple[str, str]]:
    """Plain BPE: repeatedly merge the most frequent adjacent pair.

    Ties go to the lexicographically smallest pair so the result never depends on
    iteration order. Stops early if no pair occurs twice.
    """
    splits = {word: list(word) for word in sorted(words)}
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, parts in splits.items():
            for pair in zip(parts, parts[1:], strict=False):
                pairs[pair] += words[word]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        for word, parts in splits.items():
            out: list[str] = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            splits[word] = out
    return merges


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Build the test tokenizer: byte-level BPE, 336 tokens, ChatML chat template.

    `<|endoftext|>` is both eos and pad; `<|im_start|>`/`<|im_end|>` are special so
    they are never split and are dropped by `decode(..., skip_special_tokens=True)`.
    """
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words = Counter(piece for piece, _ in pre.pre_tokenize_str(CORPUS))
    merges = _learn_merges(words, NUM_MERGES)
    if len(merges) != NUM_MERGES:
        raise RuntimeError(f"tiny tokenizer corpus yields {len(merges)} merges, need {NUM_MERGES}")

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    if len(vocab) != 256 + NUM_MERGES:
        raise RuntimeError("tiny tokenizer merges produced a duplicate token")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False: offsets cover the whole token, leading space included, which
    # is what render() needs to map character spans onto tokens.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(list(SPECIAL_TOKENS))

    return wrap_chatml(tok)


def wrap_chatml(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """A `tokenizers` byte-level tokenizer with our special tokens -> HF fast tokenizer
    with the ChatML chat template (shared by the tiny preset and the demo target)."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        extra_special_tokens=[IM_START, IM_END],
        model_max_length=1 << 20,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """`save_pretrained`, with a tokenizer_config.json that transformers 4.57 loads too.

    transformers 5 names the class `TokenizersBackend` (unknown to 4.x) and writes the
    extra special tokens as a list under `extra_special_tokens`, which 4.x reads as a
    name -> token dict and fails on. `PreTrainedTokenizerFast` is a class both
    generations know (5.x keeps it as the name of the same backend), and
    `additional_special_tokens` is the spelling both read as a list.
    """
    tok.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    conf = json.loads(path.read_text())
    conf["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = conf.pop("extra_special_tokens", None)
    if isinstance(extra, dict):  # 4.x's named form: both generations read it
        conf["extra_special_tokens"] = extra
    elif extra:
        conf["additional_special_tokens"] = list(extra)
    path.write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")
