"""A GGUF file's metadata and tensor table, read in one pass over its header.

gguf's own GGUFReader makes a NumPy view for every element of every array, which for a 151k-token
vocabulary and its merges costs seconds at each start; this reads the same header with
struct.unpack_from (a fraction of a second) and leaves the tensors mapped, unread. The block
sizes of the quantized types still come from the gguf package (GGML_QUANT_SIZES), and
tests/specdec/test_gguf.py checks this reader against GGUFReader field by field.

Layout (GGUF v2 and v3, little-endian): magic, version u32, tensor count u64, metadata count u64;
each metadata entry a string key, a u32 type and its value (arrays: element type u32, count u64,
elements); each tensor a string name, u32 dims, u64 per dim, u32 type, u64 offset; the tensor data
after the header, aligned to general.alignment (32 by default). Strings are a u64 length and UTF-8.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


class GgufFormatError(ValueError):
    """A file that is not a readable GGUF file; the message says where it stopped making sense."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple  # GGUF order: the fastest-varying dimension first, as llama.cpp lists them
    type: int  # a GGMLQuantizationType value
    offset: int  # from the start of the file


class GgufHeader:
    """metadata {key: value} and tensors {name: TensorInfo} of one file, which stays mapped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as handle:
            try:
                self.buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as err:  # an empty file
                raise GgufFormatError(f"not a GGUF file ({err})") from None
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as err:
            raise GgufFormatError(f"the header is truncated or corrupt near byte {self.position} ({err})") from None

    def _parse(self) -> None:
        self.position = 0
        if self.buffer[:4] != b"GGUF":
            raise GgufFormatError("not a GGUF file (no GGUF magic)")
        self.position = 4
        version = self._scalar("I")
        if version not in (2, 3):
            raise GgufFormatError(f"GGUF version {version} is not supported (2 and 3 are)")
        tensor_count, metadata_count = self._scalar("Q"), self._scalar("Q")
        self.metadata = {}
        for _ in range(metadata_count):
            key = self._string()
            self.metadata[key] = self._value(self._scalar("I"))
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-self.position // alignment) * alignment
        self.tensors = {name: TensorInfo(name, shape, kind, start + offset) for name, shape, kind, offset in infos}

    def _scalar(self, code: str):
        (value,) = struct.unpack_from("<" + code, self.buffer, self.position)
        self.position += struct.calcsize(code)
        return value

    def _string(self) -> str:
        length = self._scalar("Q")
        end = self.position + length
        if end > len(self.buffer):
            raise struct.error(f"a string of {length} bytes runs past the end of the file")
        text = self.buffer[self.position : end].decode("utf-8")
        self.position = end
        return text

    def _value(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind == ARRAY:
            element, count = self._scalar("I"), self._scalar("Q")
            if element == STRING:
                return [self._string() for _ in range(count)]
            code = _SCALARS.get(element)
            if code is None:
                raise GgufFormatError(f"array of metadata type {element} is not supported")
            values = list(struct.unpack_from(f"<{count}{code}", self.buffer, self.position))
            self.position += count * struct.calcsize(code)
            return values
        code = _SCALARS.get(kind)
        if code is None:
            raise GgufFormatError(f"metadata type {kind} is not supported")
        return self._scalar(code)

    def _tensor_info(self) -> tuple:
        name = self._string()
        dims = self._scalar("I")
        shape = tuple(self._scalar("Q") for _ in range(dims))
        return name, shape, self._scalar("I"), self._scalar("Q")

    def raw_data(self, info: TensorInfo) -> np.ndarray:
        """The tensor's stored bytes (or elements, for float types) as a NumPy view, rows first:
        [..., rows, bytes per row] for block-quantized types, as gguf.quants.dequantize reads them."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        kind = GGMLQuantizationType(info.type)
        block, block_bytes = GGML_QUANT_SIZES[kind]
        rows = tuple(reversed(info.shape[1:]))
        row_bytes = info.shape[0] // block * block_bytes
        size = int(np.prod(rows, dtype=np.int64)) * row_bytes
        if info.offset + size > len(self.buffer):
            raise GgufFormatError(f"tensor {info.name} runs past the end of the file (truncated?)")
        data = np.frombuffer(self.buffer, dtype=np.uint8, count=size, offset=info.offset)
        return data.reshape(*rows, row_bytes)
