"""Hostile GGUF files (issue 29): whatever a file claims, `onelane import-gguf` refuses it in one line that names what
it found, exits 1, and leaves nothing behind; nothing reads a file's tensors before onelane's own reader has checked
its header (MLX's reader, used until issue 32, crashed the process on some of them)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.gguf_files import (
    ARRAY,
    F32,
    STRING,
    UINT8,
    UINT32,
    entry,
    header,
    llama_gguf,
    metadata,
    string,
    tensor_info,
    tensors,
    u32,
    u64,
)
from worker.gguf import GgufError, import_gguf, read_tensors

ARCH = entry("general.architecture", STRING, "llama")
PADDING = b"\0" * 2048  # (room for the tensor the record describes: only the record is wrong)


def one_tensor(dims: list[int], kind: int = F32, offset: int = 0, n_dims: int | None = None) -> bytes:
    return header(1, 1) + ARCH + tensor_info("token_embd.weight", dims, kind, offset, n_dims) + PADDING


def truncated() -> bytes:
    whole = llama_gguf()
    return whole[: whole.index(b"blk.1.ffn_down.weight") + 10]  # in the middle of the last tensor's record


def shapes(**changes: list[int]) -> dict[str, list[int]]:
    return {**tensors(), **{name.replace("__", "."): dims for name, dims in changes.items()}}


def renamed(old: str, new: str) -> dict[str, list[int]]:
    return {(new if name == old else name): dims for name, dims in tensors().items()}


#: What a file claims, and what the refusal must say it found (a regular expression).
HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "bad magic": (lambda: b"GGUX" + llama_gguf()[4:], r"is no GGUF file: it begins with b'GGUX', not b'GGUF'"),
    "empty": (lambda: b"", r"is no GGUF file: it begins with b'', not b'GGUF'"),
    "version 1": (
        lambda: b"GGUF" + u32(1) + llama_gguf()[8:],
        r"its GGUF version is 1; onelane reads versions 2 and 3",
    ),
    "truncated header": (truncated, r"the length of tensor 20's name \(21\) exceeds what a file of \d+ bytes can hold"),
    "key length 2^60": (
        lambda: header(0, 1) + string("general.architecture", 2**60) + u32(STRING) + string("llama"),
        r"the length of metadata key 1 \(1152921504606846976\) exceeds what a file of \d+ bytes can hold",
    ),
    "tensor count 2^62": (
        lambda: header(2**62, 1) + ARCH,
        r"its tensor count \(4611686018427387904\) exceeds what a file of \d+ bytes can hold",
    ),
    "metadata count 2^62": (
        lambda: header(1, 2**62) + ARCH,
        r"its metadata count \(4611686018427387904\) exceeds what a file of \d+ bytes can hold",
    ),
    "metadata count past its entries": (
        lambda: header(20, 40) + llama_gguf()[24:],
        r"the length of metadata key 18 \(\d+\) exceeds what a file of \d+ bytes can hold",
    ),
    "n_dims 2^31": (
        lambda: one_tensor([32, 8], n_dims=2**31),
        r"its tensor 'token_embd.weight' has 2147483648 dimensions; GGML tensors have 1 to 4",
    ),
    "n_dims 5": (lambda: one_tensor([1, 1, 1, 1, 1]), r"its tensor 'token_embd.weight' has 5 dimensions"),
    "a dimension of 0": (lambda: one_tensor([0, 8]), r"has dimensions \[0, 8\]: a tensor of nothing"),
    "a dimension of 2^63": (
        lambda: one_tensor([2**63, 8]),
        r"has dimensions \[9223372036854775808, 8\], which a file of \d+ bytes cannot hold",
    ),
    "tensor offset past the end": (
        lambda: one_tensor([32, 8], offset=2**40),
        r"its tensor 'token_embd.weight' \(1024 bytes at offset 1099511627776\) lies past the end of a file",
    ),
    "tensor offset off the alignment": (lambda: one_tensor([32, 8], offset=4), r"lies off the file's alignment"),
    "string length past the end": (
        lambda: header(0, 1) + string("general.architecture") + u32(STRING) + string("llama", 10**6),
        r"the length of the value of 'general.architecture' \(1000000\) exceeds what a file of \d+ bytes can hold",
    ),
    "nested array bomb": (
        lambda: header(0, 1) + string("x") + u32(ARRAY) + u32(ARRAY) + u64(1) + (u32(ARRAY) + u64(1)) * 10_000,
        r"its metadata 'x' nests arrays deeper than an array of arrays",
    ),
    "wide array bomb": (
        lambda: header(0, 1) + string("x") + u32(ARRAY) + u32(ARRAY) + u64(2**40) + u32(UINT8) + u64(2**40),
        r"the element count of 'x' \(1099511627776\) exceeds what a file of \d+ bytes can hold",
    ),
    "unknown value type": (
        lambda: header(0, 1) + string("x") + u32(99) + u64(0),
        r"the type of 'x' is 99, which is no GGUF value type",
    ),
    "bad UTF-8 key": (
        lambda: header(0, 1) + string(b"\xff\xfe") + u32(UINT8) + b"\x01",
        r"metadata key 1 is not UTF-8 text",
    ),
    "alignment 0": (
        lambda: llama_gguf(metadata(general__alignment=(UINT32, 0))),
        r"its general.alignment is 0; it must be a power of two",
    ),
    "an i-quant tensor": (
        lambda: one_tensor([256, 8], kind=23),
        r"its tensor 'token_embd.weight' is of ggml type 23 \(IQ4_XS\), which onelane does not import",
    ),
    "tensor name blk.x": (
        lambda: llama_gguf(shapes=renamed("blk.1.attn_q.weight", "blk.x.attn_q.weight")),
        r"its tensor 'blk.x.attn_q.weight' is not part of a llama model",
    ),
    "bos_token_id 999999": (
        lambda: llama_gguf(metadata(tokenizer__ggml__bos_token_id=(UINT32, 999999))),
        r"its tokenizer.ggml.bos_token_id 999999 is not in its vocabulary of 8 tokens",
    ),
    "head_count 0": (
        lambda: llama_gguf(metadata(llama__attention__head_count=(UINT32, 0))),
        r"its llama.attention.head_count is 0; a llama model's is at least 1",
    ),
    "head_count 3 (width 32)": (
        lambda: llama_gguf(metadata(llama__attention__head_count=(UINT32, 3))),
        r"its embedding length 32 does not divide among its 3 attention heads",
    ),
    "block_count 4,000,000,000": (
        lambda: llama_gguf(metadata(llama__block_count=(UINT32, 4_000_000_000))),
        r"its llama.block_count is 4000000000, but it holds the tensors of 2 \(layers 0 to 1\)",
    ),
    "a layer without its ffn_down": (
        lambda: llama_gguf(shapes={k: v for k, v in tensors().items() if k != "blk.1.ffn_down.weight"}),
        r"its layer 1 has no ffn_down tensor",
    ),
    "a tensor of the wrong shape": (
        lambda: llama_gguf(shapes=shapes(blk__0__attn_k__weight=[32, 32])),
        r"its tensor 'blk.0.attn_k.weight' has dimensions \[32, 32\], where its metadata gives \[32, 16\]",
    ),
    "vocabulary longer than the embedding": (
        lambda: llama_gguf(metadata(vocab=[*metadata()["tokenizer.ggml.tokens"][1][1], "d"])),
        r"its vocabulary has 9 tokens, but its embedding \(token_embd\) 8 rows",
    ),
    "a merge of unknown tokens": (
        lambda: llama_gguf(metadata(tokenizer__ggml__merges=(ARRAY, (STRING, ["a z"])))),
        r"its merge 'a z' is not of two tokens of its vocabulary into a third",
    ),
    "no vocabulary": (
        lambda: llama_gguf(metadata(tokenizer__ggml__tokens=None, tokenizer__ggml__token_type=None)),
        r"its vocabulary \(tokenizer.ggml.tokens\) is missing",
    ),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_file_is_refused_in_one_line_naming_what_was_found(kind, tmp_path):
    # Given a file that lies about itself, and the folder it would be imported into
    make, found = HOSTILE[kind]
    source = tmp_path / "h.gguf"
    source.write_bytes(make())
    (tmp_path / "models").mkdir()
    # When `onelane import-gguf` is asked to import it
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "import-gguf", str(source), str(tmp_path / "models" / "h")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then it exits 1 with one line naming what it found (the file by its name only), and leaves nothing behind
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: h.gguf"), done.stderr
    assert re.search(found, lines[0]), lines[0]
    assert str(tmp_path) not in lines[0]
    assert list((tmp_path / "models").iterdir()) == []


def test_the_tiny_llama_the_hostile_files_are_made_from_imports(tmp_path):
    # (the table's files are this one, written wrong in one place each)
    source = tmp_path / "tiny.gguf"
    source.write_bytes(llama_gguf())
    folder = import_gguf(source, tmp_path / "tiny")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}


def test_the_tensor_process_reads_only_what_it_checked_itself(tmp_path):
    # Given a file that crashed MLX's own reader (an alignment of 0: SIGFPE), handed straight to the tensor process
    source = tmp_path / "crash.gguf"
    source.write_bytes(llama_gguf(metadata(general__alignment=(UINT32, 0))))
    # When the tensors are read, Then that process checks the header itself and refuses the file in words
    with pytest.raises(GgufError, match=r"^crash.gguf: its general.alignment is 0; it must be a power of two"):
        read_tensors(source, tmp_path / "model.safetensors", None)
    assert not (tmp_path / "model.safetensors").exists()
