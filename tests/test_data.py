"""Data pipeline: tiny tokenizer, record loading, chat rendering, packing, streams."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash.data.packing import PackedBatch, RowPacker
from dflash.data.render import render
from dflash.data.sources import DataError, load_records, normalise_record
from dflash.data.stream import RandomStream, SampleStream
from dflash.data.tokenizer import IM_END, build_tiny_tokenizer

# sha256 of json.dumps(get_vocab(), sort_keys=True): changes iff the vocabulary does.
TINY_VOCAB_SHA256 = "5dc3ad82963a3baa193bb281b31e50d9175596b90d88a6ffaef9729ca03c5a47"

WORDS = ["the", "result", "of", "a", "value", "is", "returned", "to", "caller", "and", "draft"]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def make_records(n: int, seed: int = 0, max_words: int = 30) -> list[list[dict[str, str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(1, max_words + 1)))
        out.append(chat(f"q{i}", " ".join(words)))
    return out


def split_docs(batch: PackedBatch, pad_id: int) -> list[list[tuple[list[int], list[bool]]]]:
    """Per row, the (ids, mask) of each document; asserts every layout invariant."""
    R, T = batch.input_ids.shape
    for t in (batch.input_ids, batch.doc_ids, batch.positions):
        assert t.dtype == torch.int64 and t.shape == (R, T)
    assert batch.loss_mask.dtype == torch.bool and batch.loss_mask.shape == (R, T)
    rows, n_docs, n_tokens = [], 0, 0
    for r in range(R):
        doc, pos = batch.doc_ids[r].tolist(), batch.positions[r].tolist()
        used = sum(d >= 0 for d in doc)
        # Documents first, then padding only: ids 0,1,2,... contiguous, non-decreasing.
        assert all(d == -1 for d in doc[used:]) and all(d >= 0 for d in doc[:used])
        assert all(b - a in (0, 1) for a, b in zip(doc[:used], doc[1:used], strict=False))
        assert not doc[:used] or doc[0] == 0
        assert batch.input_ids[r, used:].eq(pad_id).all()
        assert not batch.loss_mask[r, used:].any() and not batch.positions[r, used:].any()
        docs = []
        for d in range(doc[used - 1] + 1 if used else 0):
            idx = [t for t in range(used) if doc[t] == d]
            assert [pos[t] for t in idx] == list(range(len(idx)))  # restart at 0 per doc
            docs.append((batch.input_ids[r, idx].tolist(), batch.loss_mask[r, idx].tolist()))
        rows.append(docs)
        n_docs, n_tokens = n_docs + len(docs), n_tokens + used
    assert (batch.n_docs, batch.n_tokens) == (n_docs, n_tokens)
    return rows


def assert_greedy(rows: list[list[tuple[list[int], list[bool]]]], seq_len: int) -> None:
    """A row closes with padding only if the next document did not fit in it."""
    for cur, nxt in zip(rows, rows[1:], strict=False):
        free = seq_len - sum(len(ids) for ids, _ in cur)
        if nxt:
            assert len(nxt[0][0]) > free


def expected_docs(stream: SampleStream, records, tok, epochs: int):
    """What the stream must yield, in order: (ids, mask, was_truncated) per used sample."""
    out = []
    for e in range(epochs):
        for i in stream.order(e):
            ids, mask = render(tok, records[int(i)])
            cut = len(ids) > stream.seq_len
            ids, mask = ids[: stream.seq_len], mask[: stream.seq_len]
            if sum(mask) >= stream.min_loss_tokens:
                out.append((ids, [bool(m) for m in mask], cut))
    return out


def batches_equal(a: PackedBatch, b: PackedBatch) -> bool:
    return all(
        torch.equal(getattr(a, f), getattr(b, f))
        for f in ("input_ids", "loss_mask", "doc_ids", "positions")
    ) and (a.n_docs, a.n_tokens) == (b.n_docs, b.n_tokens)


# ---------------------------------------------------------------- tokenizer


def test_tiny_tokenizer_shape_and_specials(tok):
    assert len(tok) == 336 and len(tok) % 64 != 0  # leaves padded embedding rows
    assert tok.pad_token == tok.eos_token == "<|endoftext|>"
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [333, 334, 335] and tok.pad_token_id == 333
    assert tok.convert_tokens_to_ids(["a", "\u0120"]) == [ord("a"), ord(" ")]  # id == byte
    text = "héllo wörld ✓ {x: 1}\n\tdone"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_chat_template_is_chatml(tok):
    msgs = chat("Hi", "Hello!")
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    assert tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenizer_is_deterministic(tok):
    other = build_tiny_tokenizer()
    assert tok.backend_tokenizer.to_str() == other.backend_tokenizer.to_str()
    digest = hashlib.sha256(json.dumps(tok.get_vocab(), sort_keys=True).encode()).hexdigest()
    assert digest == TINY_VOCAB_SHA256


def test_tokenizer_save_load_round_trip(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    assert back.get_vocab() == tok.get_vocab() and len(back) == len(tok)
    assert back.chat_template == tok.chat_template
    assert (back.pad_token_id, back.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    msgs = chat("What is the result?", "The result is 0.")
    assert render(back, msgs) == render(tok, msgs)


# ---------------------------------------------------------------- rendering


def masked_runs(tok, ids: list[int], mask: list[int]) -> list[str]:
    runs, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            runs, cur = [*runs, tok.decode(cur)], []
    return runs + ([tok.decode(cur)] if cur else [])


def test_render_single_turn_masks_response_and_end_of_turn(tok):
    ids, mask = render(tok, chat("Tell me ✓", "Sure: héllo, wörld ✓"))
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    assert masked_runs(tok, ids, mask) == ["Sure: héllo, wörld ✓" + IM_END]
    assert tok.decode(ids) == tok.apply_chat_template(
        chat("Tell me ✓", "Sure: héllo, wörld ✓"), tokenize=False
    )
    assert mask[-1] == 0 and tok.decode(ids[-1:]) == "\n"  # newline after <|im_end|> not trained


def test_render_multi_turn_masks_only_assistant_turns(tok):
    msgs = [
        {"role": "system", "content": "Be short."},
        {"role": "user", "content": "What is the value?"},
        {"role": "assistant", "content": "The value is 1."},
        {"role": "user", "content": "And then?"},
        {"role": "assistant", "content": "Then it is returned."},
    ]
    ids, mask = render(tok, msgs)
    assert masked_runs(tok, ids, mask) == [
        f"The value is 1.{IM_END}",
        f"Then it is returned.{IM_END}",
    ]
    unmasked = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "Be short." in unmasked and "And then?" in unmasked and "The value" not in unmasked


def test_render_prompt_response_record(tok):
    msgs = normalise_record({"prompt": "P?", "response": "R."})
    assert msgs == chat("P?", "R.")
    ids, mask = render(tok, msgs)
    assert masked_runs(tok, ids, mask) == ["R." + IM_END]


def test_render_works_with_another_template_shape():
    # Llama-3-like: BOS up front, headers closed by a special token, no newline after
    # the end-of-turn token. The mask must still be exactly content + end-of-turn.
    other = build_tiny_tokenizer()
    other.chat_template = (
        "<|endoftext|>{% for m in messages %}<|im_start|>{{ m.role }}<|im_end|>\n\n"
        "{{ m.content }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant<|im_end|>\n\n{% endif %}"
    )
    msgs = [*chat("a b", "the value"), *chat("c", " draft ")]
    ids, mask = render(other, msgs)
    assert ids[0] == other.eos_token_id  # template BOS kept, not doubled
    assert masked_runs(other, ids, mask) == [f"the value{IM_END}", f" draft {IM_END}"]


def test_render_without_chat_template_is_a_clear_error(tok):
    bare = build_tiny_tokenizer()
    bare.chat_template = None
    with pytest.raises(DataError, match="no chat template.*chat_template"):
        render(bare, chat("a", "b"))


def test_render_rejects_template_that_is_not_prefix_consistent():
    odd = build_tiny_tokenizer()
    # Writes the message count up front: every longer render changes the first line.
    odd.chat_template = "{{ messages|length }}\n" + odd.chat_template
    with pytest.raises(DataError, match="prefix-consistent at message 1"):
        render(odd, chat("a", "b"))


# ---------------------------------------------------------------- sources

GOOD_ROWS = [
    {"messages": chat("u1", "a1")},
    {"prompt": "u2", "response": "a2"},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "u"}, {"type": "text", "text": "3"}]},
                  {"role": "assistant", "content": "a3"}]},
]  # fmt: skip
EXPECTED = [chat("u1", "a1"), chat("u2", "a2"), chat("u3", "a3")]


def write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_load_jsonl(tmp_path):
    lines = [json.dumps(r) for r in GOOD_ROWS]
    rs = load_records(write_jsonl(tmp_path / "d.jsonl", [lines[0], "", *lines[1:]]))
    assert len(rs) == 3 and rs.bad_rows == 0 and rs.source.endswith("d.jsonl")
    assert [rs[i] for i in range(3)] == EXPECTED and rs[-1] == EXPECTED[-1]
    with pytest.raises(IndexError):
        rs[3]


def test_load_parquet_and_saved_dataset(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    rs = load_records(str(tmp_path / "d.parquet"))
    assert len(rs) == 5 and rs[4] == chat("p4", "r4")

    msgs = [{"messages": chat(f"u{i}", f"a{i}")} for i in range(4)]
    datasets.Dataset.from_list(msgs).save_to_disk(str(tmp_path / "ds"))
    rs = load_records(str(tmp_path / "ds"))
    assert len(rs) == 4 and rs[2] == chat("u2", "a2")

    datasets.DatasetDict({"train": datasets.Dataset.from_list(msgs)}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(DataError, match="DatasetDict.*dd/train"):
        load_records(str(tmp_path / "dd"))


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [json.dumps(GOOD_ROWS[0]), "", '{"messages": [', json.dumps(GOOD_ROWS[1])],
    )
    with pytest.raises(DataError, match=r"bad\.jsonl, line 3: malformed JSON.*--skip-bad-rows"):
        load_records(path)
    rs = load_records(path, skip_bad_rows=True)
    assert (len(rs), rs.bad_rows) == (2, 1) and rs[1] == EXPECTED[1]
    stream = SampleStream(rs, build_tiny_tokenizer(), seq_len=64, seed=0, min_loss_tokens=1)
    assert next(stream).n_docs == 4  # 14 tokens each: two epochs of 2 records in 64 tokens
    assert stream.stats() == {
        "samples": 4, "dropped_short": 0, "truncated": 0, "batches": 1, "bad_rows": 1, "epoch": 2
    }  # fmt: skip


def test_missing_fields_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write_jsonl(tmp_path / "m.jsonl", [json.dumps(GOOD_ROWS[0]), json.dumps({"text": "x"})])
    with pytest.raises(
        DataError, match=r"m\.jsonl, line 2: .*'messages'.*'prompt' \+ 'response'.*\['text'\]"
    ):
        load_records(path)
    assert load_records(path, skip_bad_rows=True).bad_rows == 1

    rows = [{"prompt": "p", "response": "r"}, {"prompt": "p", "response": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    with pytest.raises(DataError, match=r"m\.parquet, row 1 \(0-based\).*--skip-bad-rows"):
        load_records(str(tmp_path / "m.parquet"))
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "cols.parquet")
    with pytest.raises(DataError, match="no usable columns.*'messages'"):
        load_records(str(tmp_path / "cols.parquet"))


def test_empty_and_unsupported_inputs(tmp_path):
    with pytest.raises(DataError, match="empty"):
        load_records(write_jsonl(tmp_path / "e.jsonl", [""]))
    path = write_jsonl(tmp_path / "allbad.jsonl", ["{", "["])
    with pytest.raises(DataError, match=r"empty \(2 bad rows skipped\)"):
        load_records(path, skip_bad_rows=True)
    with pytest.raises(DataError, match="unsupported format"):
        load_records(write_jsonl(tmp_path / "d.csv", ["a,b"]))
    with pytest.raises(DataError, match="no such file"):
        load_records(str(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------- packing


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 3),
    seq_len=st.integers(1, 12),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=20),
    data=st.data(),
)
def test_row_packer_properties(rows, seq_len, lengths, data):
    lengths = [min(n, seq_len) for n in lengths]
    packer, placed, rejected = RowPacker(rows, seq_len, pad_id=7), [], None
    for k, n in enumerate(lengths):
        mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        doc = ([100 + k] * n, mask)
        if not packer.add(*doc):
            rejected = doc
            break
        placed.append(doc)
    assert packer.full or rejected is None
    got = split_docs(packer.build(), pad_id=7)
    assert [d for row in got for d in row] == placed  # order and content preserved
    assert_greedy(got + ([[rejected]] if rejected else []), seq_len)


LAYOUTS = [  # (rows, seq_len, max_words, expect_truncation)
    (1, 40, 30, True),  # short rows: long samples are cut
    (2, 40, 30, True),
    (1, 97, 12, False),  # several docs per row, padding at row ends
    (2, 256, 30, False),
]


@pytest.mark.parametrize(("rows", "seq_len", "max_words", "expect_cut"), LAYOUTS)
def test_sample_stream_packs_the_shuffled_data(tok, rows, seq_len, max_words, expect_cut):
    records = make_records(13, seed=rows + seq_len, max_words=max_words)
    stream = SampleStream(records, tok, seq_len=seq_len, rows=rows, seed=3, min_loss_tokens=6)
    got = []
    while stream.epoch < 1 or len(got) < 4:  # run into the second epoch
        b = next(stream)
        assert b.input_ids.shape == (rows, seq_len)
        got.append(split_docs(b, tok.pad_token_id))
    flat_rows = [r for rows_docs in got for r in rows_docs]
    assert_greedy(flat_rows, seq_len)
    docs = [d for r in flat_rows for d in r]
    want = expected_docs(stream, records, tok, epochs=stream.epoch + 1)[: len(docs)]
    assert docs == [(ids, mask) for ids, mask, _ in want]
    s = stream.stats()
    assert s["samples"] == len(docs) and s["epoch"] >= 1 and s["bad_rows"] == 0
    assert s["truncated"] == sum(cut for *_, cut in want) and (s["truncated"] > 0) == expect_cut
    # Visited so far: whole past epochs, then the current one up to the cursor.
    visited = [i for e in range(s["epoch"]) for i in stream.order(e)]
    visited += list(stream.order(s["epoch"])[: stream.cursor])
    short = [sum(render(tok, records[int(i)])[1][:seq_len]) < 6 for i in visited]
    assert s["dropped_short"] == sum(short) and s["samples"] == len(short) - sum(short)


def test_docs_exactly_filling_rows_leave_no_padding(tok):
    records = [chat("q", str(i % 10) * 3) for i in range(8)]
    lengths = {len(render(tok, r)[0]) for r in records}
    assert len(lengths) == 1
    (n,) = lengths
    stream = SampleStream(records, tok, seq_len=2 * n, rows=2, seed=0, min_loss_tokens=1)
    for _ in range(5):
        b = next(stream)
        assert b.n_tokens == 4 * n and b.n_docs == 4 and (b.doc_ids >= 0).all()
        assert b.doc_ids[:, n - 1 : n + 1].tolist() == [[0, 1], [0, 1]]
    assert stream.stats()["truncated"] == 0


def test_all_samples_too_short_is_a_clear_error(tok):
    stream = SampleStream(make_records(5), tok, seq_len=64, seed=0, min_loss_tokens=10_000)
    with pytest.raises(DataError, match=r"no usable sample.*all 5.*min_loss_tokens=10000"):
        next(stream)


def test_sharding_is_disjoint_and_covers_every_record(tok):
    records = make_records(17)
    streams = [
        SampleStream(records, tok, seq_len=64, seed=5, min_loss_tokens=1, rank=r, world_size=3)
        for r in range(3)
    ]
    for epoch in (0, 1):
        shards = [set(s.order(epoch).tolist()) for s in streams]
        assert sum(len(x) for x in shards) == 17 and set.union(*shards) == set(range(17))
    assert streams[0].order(0).tolist() != streams[0].order(1).tolist()  # reshuffled
    with pytest.raises(DataError, match="fewer than world_size=18"):
        SampleStream(records, tok, seq_len=64, seed=5, min_loss_tokens=1, rank=0, world_size=18)


@pytest.mark.parametrize("cut", [0, 1, 3, 7])
def test_sample_stream_state_round_trip_is_exact(tok, cut):
    records = make_records(11, seed=1)
    kw = dict(seq_len=48, rows=2, seed=9, min_loss_tokens=3, rank=1, world_size=2)
    a = SampleStream(records, tok, **kw)
    for _ in range(cut):
        next(a)
    if cut == 3:  # this point has a sample carried over to the next batch
        assert a._pending is not None
    state = json.loads(json.dumps(a.state_dict()))
    b = SampleStream(records, tok, **kw)
    b.load_state_dict(state)
    for _ in range(6):  # crosses epoch boundaries (≈3 batches per epoch per rank)
        assert batches_equal(next(a), next(b))
    assert a.stats() == b.stats()
    with pytest.raises(ValueError, match="seed=9"):
        SampleStream(records, tok, **{**kw, "seed": 10}).load_state_dict(state)


# ---------------------------------------------------------------- random stream


def test_random_stream_layout_and_determinism():
    kw = dict(vocab_size=50, seq_len=32, rows=3, seed=4, min_doc_len=3, max_doc_len=9)
    a, b = RandomStream(**kw), RandomStream(**kw)
    for i in range(4):
        x, y = next(a), next(b)
        assert batches_equal(x, y) and batches_equal(x.to("cpu"), a.batch_at(i)[0])
        rows = split_docs(x, pad_id=0)
        assert x.n_tokens == 3 * 32 and x.loss_mask.all() and (x.doc_ids >= 0).all()
        assert int(x.input_ids.min()) >= 0 and int(x.input_ids.max()) < 50
        for row in rows:
            assert all(3 <= len(ids) <= 9 for ids, _ in row[:-1]) and len(row[-1][0]) <= 9
    other_rank = RandomStream(**kw, rank=1, world_size=2)
    assert not torch.equal(next(other_rank).input_ids, a.batch_at(0)[0].input_ids)
    assert a.stats()["samples"] == sum(a.batch_at(i)[0].n_docs for i in range(4))


def test_random_stream_state_round_trip_is_exact():
    kw = dict(vocab_size=97, seq_len=20, rows=2, seed=1, min_doc_len=1, max_doc_len=30)
    a = RandomStream(**kw)
    for _ in range(3):
        next(a)
    b = RandomStream(**kw)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for _ in range(3):
        assert batches_equal(next(a), next(b))
    assert a.stats() == b.stats() and a.stats()["truncated"] > 0
