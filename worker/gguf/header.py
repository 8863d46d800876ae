"""A GGUF file's header, read without trusting it: the metadata and the tensors' records (ggml's docs/gguf.md).

Nothing else reads a file before this does: readers that trust its counts and lengths crash or allocate without
bound on the lies a file can tell (MLX's crashed the process on a key of 2^60 bytes, 2^62 tensors, 2^31 dimensions,
an alignment of 0). So every count and length is checked against the bytes left in the file, and against bounds of
its own, before anything is allocated for it; every tensor's data must lie within the file, in a type onelane
imports. The header is read through the file, a field at a time (a model's weights, gigabytes after it, are never
read here); the tensors are then read from the places checked here and nowhere else (worker/gguf/tensors.py).
Anything wrong is a GgufError naming what was found, and the file by its name only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from worker.unsupported import Unsupported

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 counted in 32 bits; llama.cpp has written 3 since 2023
MAX_KEY = 65535  # bytes of a metadata key (the spec's bound)
MAX_NAME = 64  # bytes of a tensor's name (GGML_MAX_NAME)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 24  # metadata array elements in all: a vocabulary and its merges are a few hundred thousand
MAX_ALIGNMENT = 1 << 16
DEFAULT_ALIGNMENT = 32

STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # struct's
VALUE_TYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array",
               "uint64", "int64", "float64")  # fmt: skip
NUMBERS = {f: struct.Struct("<" + f) for f in SCALARS.values()}
SMALLEST = {**{kind: NUMBERS[f].size for kind, f in SCALARS.items()}, STRING: 8, ARRAY: 12}  # a value's bytes
SMALLEST_ENTRY = 8 + 1 + 4 + 1  # a metadata entry: key length, a 1-byte key, its type, a 1-byte value
SMALLEST_TENSOR = 8 + 1 + 4 + 8 + 4 + 8  # a tensor's record: name length, a 1-byte name, 1 dimension, type, offset

#: The ggml tensor types onelane imports, with their block: (name, elements per block, bytes per block); the gguf
#: package (llama.cpp's) dequantizes each of them (worker/gguf/tensors.py).
TENSOR_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 30: ("BF16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
                6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
                11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210)}  # fmt: skip
OTHER_TYPES = {9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
               21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
               29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}  # fmt: skip


class GgufError(Unsupported):
    """The file cannot be imported; the message says why, in words for the one who gave it (and for a client whose
    job needed the model: it names no server path)."""


@dataclass(frozen=True)
class Tensor:
    """A tensor's record: its dims in GGUF's order (the fastest-moving first), ggml type, and where its data is."""

    name: str
    dims: tuple[int, ...]
    type: int
    start: int  # from the start of the file
    size: int  # bytes

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES[self.type][0]

    @property
    def quantized(self) -> bool:
        return TENSOR_TYPES[self.type][1] > 1


@dataclass(frozen=True)
class Header:
    """What a GGUF file says of itself."""

    name: str  # the file's name, for messages
    version: int
    metadata: dict[str, Any]  # numbers as int or float, strings as str, arrays as lists
    tensors: dict[str, Tensor]


def shown(text: str, most: int = 80) -> str:
    """A name from the file as a message quotes it: on one line, and not too long."""
    return repr(text if len(text) <= most else text[:most] + "…")


def described(value: Any) -> str:
    """A metadata value as a message names it, however long it is."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, str):
        return shown(value)
    return "missing" if value is None else repr(value)


def read_header(path: Path) -> Header:
    """Read and check the header of the GGUF file at `path` (a GgufError says what is wrong)."""
    try:
        with open(path, "rb") as file:
            size = path.stat().st_size
            return _Reader(file, size, path.name).header()
    except OSError as exc:
        raise GgufError(f"{path.name}: cannot be read ({exc.strerror})") from None


class _Reader:
    """One pass over a header, a field at a time, each count and length checked before it is trusted."""

    def __init__(self, file: BinaryIO, size: int, name: str) -> None:
        self.file, self.size, self.name = file, size, name
        self.pos = 0
        self.elements = 0  # metadata array elements read so far

    def refuse(self, what: str) -> GgufError:
        return GgufError(f"{self.name}: {what}")

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise self.refuse(f"{what} runs past the end of the file (byte {self.pos} of {self.size})")
        data = self.file.read(n)
        if len(data) != n:  # (the file shrank while being read)
            raise self.refuse(f"{what} runs past the end of the file (byte {self.pos} of {self.size})")
        self.pos += n
        return data

    def number(self, fmt: str, what: str) -> Any:
        unpack = NUMBERS[fmt]
        return unpack.unpack(self.take(unpack.size, what))[0]

    def count(self, what: str, each: int, most: int | None = None) -> int:
        """A uint64 count (`what`: "its tensor count") of things of at least `each` bytes: no more than the rest of
        the file could hold, nor than `most`."""
        n = self.number("Q", what)
        if n * each > self.left:
            raise self.refuse(f"{what} ({n}) exceeds what a file of {self.size} bytes can hold")
        if most is not None and n > most:
            raise self.refuse(f"{what} ({n}) is more than {most}")
        return int(n)

    def text(self, what: str, most: int | None = None) -> str:
        raw = self.take(self.count(f"the length of {what}", 1, most), what)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise self.refuse(f"{what} is not UTF-8 text ({shown(raw.decode(errors='replace'))})") from None

    def header(self) -> Header:
        magic = self.file.read(len(MAGIC))
        self.pos = len(magic)
        if magic != MAGIC:
            raise GgufError(f"{self.name} is no GGUF file: it begins with {magic!r}, not {MAGIC!r}")
        version = self.number("I", "its version")
        if version not in VERSIONS:
            raise self.refuse(f"its GGUF version is {version}; onelane reads versions 2 and 3")
        n_tensors = self.count("its tensor count", SMALLEST_TENSOR)
        n_entries = self.count("its metadata count", SMALLEST_ENTRY)
        if n_tensors * SMALLEST_TENSOR + n_entries * SMALLEST_ENTRY > self.left:
            raise self.refuse(
                f"its {n_tensors} tensors and {n_entries} metadata entries exceed what a file of {self.size} bytes "
                "can hold"
            )
        metadata: dict[str, Any] = {}
        for i in range(n_entries):
            key = self.text(f"metadata key {i + 1}", MAX_KEY)
            if not key or key in metadata:
                raise self.refuse(f"its metadata key {shown(key)} is {'empty' if not key else 'given twice'}")
            metadata[key] = self.value(self.kind(f"the type of {shown(key)}"), shown(key))
        tensors: dict[str, tuple[tuple[int, ...], int, int]] = {}
        for i in range(n_tensors):
            name = self.text(f"tensor {i + 1}'s name", MAX_NAME)
            if name in tensors:
                raise self.refuse(f"it holds two tensors named {shown(name)}")
            tensors[name] = self.tensor_record(name)
        return Header(self.name, version, metadata, self.placed(tensors, metadata.get("general.alignment")))

    def kind(self, what: str) -> int:
        kind = self.number("I", what)
        if kind >= len(VALUE_TYPES):
            raise self.refuse(f"{what} is {kind}, which is no GGUF value type")
        return int(kind)

    def value(self, kind: int, key: str, depth: int = 0) -> Any:
        """A metadata value of GGUF type `kind`; an array's elements are counted against MAX_ELEMENTS, and an array
        holds arrays of values at most (as MLX reads them)."""
        if kind in SCALARS:
            return self.number(SCALARS[kind], f"the value of {key}")
        if kind == STRING:
            return self.text(f"the value of {key}")
        element = self.kind(f"the element type of {key}")
        if element == ARRAY and depth >= 1:
            raise self.refuse(f"its metadata {key} nests arrays deeper than an array of arrays")
        n = self.count(f"the element count of {key}", SMALLEST[element])
        self.elements += n
        if self.elements > MAX_ELEMENTS:
            raise self.refuse(f"its metadata arrays hold more than {MAX_ELEMENTS} elements (at {key})")
        if element in SCALARS:
            fmt = f"<{n}{SCALARS[element]}"
            return list(struct.unpack(fmt, self.take(struct.calcsize(fmt), f"the value of {key}")))
        return [self.value(element, key, depth + 1) for _ in range(n)]

    def tensor_record(self, name: str) -> tuple[tuple[int, ...], int, int]:
        """A tensor's dims, type and offset (from the start of the data), each checked on its own."""
        n_dims = self.number("I", f"the dimension count of {shown(name)}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.refuse(f"its tensor {shown(name)} has {n_dims} dimensions; GGML tensors have 1 to {MAX_DIMS}")
        dims = tuple(self.number("Q", f"the dimensions of {shown(name)}") for _ in range(n_dims))
        elements = 1
        for d in dims:
            elements *= d
        if 0 in dims:
            raise self.refuse(f"its tensor {shown(name)} has dimensions {list(dims)}: a tensor of nothing")
        if elements > 2 * self.size:  # (an element takes more than half a byte; placed() checks the size exactly)
            raise self.refuse(f"its tensor {shown(name)} has dimensions {list(dims)}, which a file of {self.size} "
                              "bytes cannot hold")  # fmt: skip
        kind = self.number("I", f"the type of {shown(name)}")
        if kind not in TENSOR_TYPES:
            found = OTHER_TYPES.get(kind, "unknown")
            readable = ", ".join(t[0] for t in TENSOR_TYPES.values())
            raise self.refuse(
                f"its tensor {shown(name)} is of ggml type {kind} ({found}), which onelane does not import; it "
                f"imports {readable} (an i-quant such as IQ4_XS is not)"
            )
        _, block, _ = TENSOR_TYPES[kind]
        if dims[0] % block:
            raise self.refuse(f"its tensor {shown(name)} is {TENSOR_TYPES[kind][0]}, whose rows come in blocks of "
                              f"{block}, but its rows are {dims[0]} long")  # fmt: skip
        return dims, int(kind), self.number("Q", f"the offset of {shown(name)}")

    def placed(self, records: dict[str, tuple[tuple[int, ...], int, int]], alignment: Any) -> dict[str, Tensor]:
        """The tensors, each with its data's place in the file, which must hold it. The data begins at the first
        multiple of the alignment after the header, and each tensor's offset is a multiple of it too."""
        if alignment is None:
            alignment = DEFAULT_ALIGNMENT
        if type(alignment) is not int or not 0 < alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
            raise self.refuse(
                f"its general.alignment is {described(alignment)}; it must be a power of two up to {MAX_ALIGNMENT}"
            )
        data = self.pos + (-self.pos % alignment)
        tensors = {}
        for name, (dims, kind, offset) in records.items():
            _, block, block_bytes = TENSOR_TYPES[kind]
            elements = 1
            for d in dims:
                elements *= d
            size = elements // block * block_bytes
            if offset % alignment or data + offset + size > self.size:
                raise self.refuse(
                    f"its tensor {shown(name)} ({size} bytes at offset {offset}) lies "
                    + (
                        "off the file's alignment"
                        if offset % alignment
                        else f"past the end of a file of {self.size} bytes"
                    )
                )
            tensors[name] = Tensor(name, dims, kind, data + offset, size)
        return tensors
