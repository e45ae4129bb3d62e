"""Regenerated data: resume without loss or duplicates, batching, OpenAI-server client."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from test_eval import save_tiny_pair

from dflash.data.sources import load_records
from dflash.regen import LocalGenerator, ServerGenerator, done_ids, regenerate


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("pair"))[0]


@pytest.fixture
def prompts(tmp_path):
    words = ["def", "class", "return", "for value in", "import", "the", "print", "x ="]
    rows = [{"id": f"p{i}", "prompt": " ".join(words[i % 8 : i % 8 + 1 + i % 3])} for i in range(7)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_resume_after_interruption_no_loss_no_duplicates(tmp_path, target_dir, prompts):
    gen = LocalGenerator(str(target_dir), max_new_tokens=8)
    full = tmp_path / "full.jsonl"
    regenerate(str(prompts), str(full), gen, batch_size=3, progress=False)

    part = tmp_path / "part.jsonl"
    first = regenerate(str(prompts), str(part), gen, batch_size=3, stop_after_batches=1)
    assert first["written"] == 3
    with open(part, "a") as f:  # a crash in the middle of writing the next row
        f.write('{"id": "p3", "messages": [{"role"')
    second = regenerate(str(prompts), str(part), gen, batch_size=3, progress=False)
    assert second == {"prompts": 7, "skipped": 3, "written": 4, "cut": second["cut"]}
    assert _rows(part) == _rows(full)
    assert [r["id"] for r in _rows(part)] == [f"p{i}" for i in range(7)]
    again = regenerate(str(prompts), str(part), gen, batch_size=3, progress=False)
    assert again["written"] == 0 and len(_rows(part)) == 7
    # the output is training data in `messages` form
    records = load_records(str(part))
    assert len(records) == 7 and records[0][-1]["role"] == "assistant"


def test_done_ids_cuts_torn_line(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c", "mess')
    assert done_ids(str(path)) == {"a", "b"}
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'


def test_batched_equals_one_at_a_time(target_dir, prompts, tmp_path):
    gen = LocalGenerator(str(target_dir), max_new_tokens=8)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    regenerate(str(prompts), str(a), gen, batch_size=1, progress=False)
    regenerate(str(prompts), str(b), gen, batch_size=4, progress=False)
    assert _rows(a) == _rows(b)


class _ChatHandler(BaseHTTPRequestHandler):
    """Minimal OpenAI /v1/chat/completions backed by the tiny local target."""

    generator: LocalGenerator
    seen: list

    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions" and req["temperature"] == 0
        self.seen.append(req)
        self.generator.max_new_tokens = req["max_tokens"]
        with _LOCK:
            text, reason = self.generator([req["messages"]])[0]
        msg = {"role": "assistant", "content": text}
        self._send({"choices": [{"index": 0, "message": msg, "finish_reason": reason}]})

    def log_message(self, *args):
        pass


_LOCK = threading.Lock()


def test_server_client_matches_local(target_dir, prompts, tmp_path):
    torch.set_num_threads(1)
    local = LocalGenerator(str(target_dir), max_new_tokens=8)
    _ChatHandler.generator, _ChatHandler.seen = local, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        remote = ServerGenerator(url, max_new_tokens=8, concurrency=3)
        assert remote.model == "tiny"
        a, b = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
        regenerate(str(prompts), str(a), local, batch_size=1, progress=False)
        regenerate(str(prompts), str(b), remote, batch_size=4, progress=False)
    finally:
        server.shutdown()
    assert _rows(a) == _rows(b)
    assert len(_ChatHandler.seen) == 7 and _ChatHandler.seen[0]["model"] == "tiny"


def test_server_unreachable_is_a_clear_error():
    with pytest.raises(ConnectionError, match="Is the server running"):
        ServerGenerator("http://127.0.0.1:9", max_new_tokens=4, model="m")._one([])
