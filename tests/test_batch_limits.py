"""A batch's input file over ONELANE_MAX_BATCH_LINES is refused as it is read, at once, in memory bounded by a small
multiple of the file (it was refused after every line had been parsed and kept: 38 s and 80 times the file's size of
one web worker for 32 MiB of tiny lines); and the file is split a piece at a time exactly as it would be whole."""

from __future__ import annotations

import io
import random
import time
import tracemalloc

import pytest

from tasks import keys
from web.openai.batches import input as batch_input

MiB = 1 << 20
KEY = {"Authorization": "Bearer anything"}  # local mode: any key is the local user's


def file_of(line: bytes, size: int = 32 * MiB) -> bytes:
    return line * (size // len(line))


@pytest.mark.parametrize(
    "data, limit",
    [
        (file_of(b"{}\n"), 50_000),  # 11 million tiny lines
        (file_of(b'{"custom_id": "x", "pad": "' + b"x" * (2 * MiB) + b'"}\n'), 10),  # 16 lines of 2 MiB
    ],
    ids=["tiny lines", "huge lines"],
)
def test_a_32_mib_file_of_too_many_lines_is_refused_at_once_in_bounded_memory(settings, make_app, store, data, limit):
    # Given a 32 MiB file of more lines than a batch takes, uploaded
    client = make_app(settings.model_copy(update={"max_batch_lines": limit})).test_client()
    upload = {"file": (io.BytesIO(data), "big.jsonl"), "purpose": "batch"}
    file_id = client.post("/v1/files", data=upload, headers=KEY).get_json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}

    # When a batch of it is created
    tracemalloc.start()
    started = time.monotonic()
    try:
        refused = client.post("/v1/batches", json=body, headers=KEY)
        took, (_, peak) = time.monotonic() - started, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # Then it is refused naming the limit, within seconds and a few times the file's size, and nothing runs
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "input_file_id"
    assert f"at most {limit} (ONELANE_MAX_BATCH_LINES)" in refused.get_json()["error"]["message"]
    assert took < 10 and peak < 8 * len(data), f"{took:.1f} s, peak {peak / len(data):.1f} times the file"
    assert store.redis.zcard(keys.BATCHES) == 0 and store.redis.zcard(keys.QUEUE) == 0


def whole_lines(data: bytes) -> list[str]:
    """JSONL's lines of `data`, decoded whole: ended by \n or \r\n alone."""
    text = data.decode("utf-8", errors="replace")
    return [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")] if text else []


def test_a_file_is_split_a_piece_at_a_time_exactly_as_it_would_be_whole(monkeypatch):
    # Given files of every line break str.splitlines knows (only \n and \r\n end a JSONL line), of characters of 1
    # to 4 bytes and of bytes that are no UTF-8, cut in pieces of a few bytes
    monkeypatch.setattr(batch_input, "PIECE", 3)
    alphabet = ["a", " ", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "é", "€", "😀"]
    rng = random.Random(29)
    for _ in range(500):
        data = "".join(rng.choices(alphabet, k=rng.randrange(40))).encode()
        if rng.random() < 0.3:
            data = data.replace(b"a", b"\xe2\x82", 1)  # a character cut short

        # Then each is split as decoding and splitting it whole would
        assert list(batch_input._texts(data)) == whole_lines(data), data
