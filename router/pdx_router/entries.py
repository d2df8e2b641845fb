"""What the router remembers about a conversation between turns."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .chat_tokens import TextPrefix

# Token ids are kept as C uint32s, 4 bytes each: a Python list of ints costs ~40 bytes a
# token (an 8-byte pointer and a 28-byte int object), 660 KiB for a 16k-token conversation.
# Vocabularies are far below 2^32, and an id outside [0, 2^32) is no token.
TOKEN_ID_TYPE = "I"
if array(TOKEN_ID_TYPE).itemsize != 4:  # pragma: no cover - every platform CPython runs on
    raise ImportError("array('I') is not 4 bytes on this platform")

# What an entry costs in memory beyond its ids, fitted with tracemalloc on entries of 64 to
# 16k tokens in blocks of 16 and 128 (within 6% from 1k tokens up): a fixed part (the
# dataclass, the kv dict, the store's key and bookkeeping), the kv's JSON size for its other
# fields, and each block id as a Python int in a list (~32 bytes: vLLM's blocks of 16 give a
# 16k-token entry 1024 of them, half as many bytes again as its ids).
ENTRY_OVERHEAD_BYTES = 1024
BLOCK_ID_BYTES = 32

# The Redis value: a version byte, the length of the JSON header, the header, then the ids as
# little-endian uint32s. Entries written before (a JSON object with the ids as a list, first
# byte `{`) are still read, so routers can be upgraded while Redis holds their entries.
_BINARY_V1 = b"\x01"
_HEADER_LEN = struct.Struct("<I")


def pack_ids(ids: Sequence[int]) -> array[int]:
    """Token ids as a compact array; OverflowError for an id outside [0, 2^32), TypeError
    for one that is not an int."""
    return ids if isinstance(ids, array) and ids.typecode == TOKEN_ID_TYPE else array(TOKEN_ID_TYPE, ids)


def _ids_to_le(ids: array[int]) -> bytes:
    if sys.byteorder == "little":
        return ids.tobytes()
    swapped = array(TOKEN_ID_TYPE, ids)
    swapped.byteswap()
    return swapped.tobytes()


def _ids_from_le(data: bytes | memoryview) -> array[int]:
    ids = array(TOKEN_ID_TYPE)
    ids.frombytes(data)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


@dataclass(frozen=True)
class Entry:
    """Decode's block metadata for one finished turn, plus what makes reusing it safe.

    token_ids are exactly the tokens whose KV decode holds (cut to remote_num_tokens), so the
    next turn can be compared token by token; they are a compact array (`pack_ids`), and any
    other sequence given is packed. Times are epoch seconds so that several router replicas
    sharing Redis agree on them.
    """

    kv: dict[str, Any]
    token_ids: array[int]
    decode_url: str
    generation: str
    stored_at: float
    deadline: float
    block_size: int | None = None
    prefix: TextPrefix | None = None  # where the router's own tokenizer may resume (chat)
    tenant: str = ""  # whose entry it is: the store bounds each tenant's bytes

    def __post_init__(self) -> None:
        ids: Sequence[int] = self.token_ids
        if not (isinstance(ids, array) and ids.typecode == TOKEN_ID_TYPE):
            object.__setattr__(self, "token_ids", pack_ids(ids))

    @property
    def num_tokens(self) -> int:
        n = self.kv.get("remote_num_tokens")
        return n if isinstance(n, int) else 0

    def nbytes(self) -> int:
        """What this entry costs the memory store, estimated once when it is put: its ids, its
        kv (JSON size plus its block ids as Python ints), its strings, a fixed overhead."""
        groups = self.kv.get("remote_block_ids")
        blocks = sum(len(g) for g in groups if isinstance(g, list)) if isinstance(groups, list) else 0
        return (
            len(self.token_ids) * self.token_ids.itemsize
            + len(orjson.dumps(self.kv))
            + blocks * BLOCK_ID_BYTES
            + len(self.decode_url)
            + len(self.generation)
            + len(self.tenant)
            + ENTRY_OVERHEAD_BYTES
        )

    def to_bytes(self) -> bytes:
        header = orjson.dumps(
            {
                "kv": self.kv,
                "d": self.decode_url,
                "g": self.generation,
                "s": self.stored_at,
                "x": self.deadline,
                "b": self.block_size,
                "p": self.prefix.to_json() if self.prefix is not None else None,
                "n": self.tenant,
            }
        )
        return b"".join((_BINARY_V1, _HEADER_LEN.pack(len(header)), header, _ids_to_le(self.token_ids)))

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Entry:
        if isinstance(data, str):
            data = data.encode()
        if data[:1] == _BINARY_V1:
            (n,) = _HEADER_LEN.unpack_from(data, 1)
            start = 1 + _HEADER_LEN.size
            raw = orjson.loads(data[start : start + n])
            ids = _ids_from_le(memoryview(data)[start + n :])
        else:  # the JSON form of earlier routers
            raw = orjson.loads(data)
            ids = pack_ids(raw["t"])
        return cls(
            kv=raw["kv"],
            token_ids=ids,
            decode_url=raw["d"],
            generation=raw["g"],
            stored_at=raw["s"],
            deadline=raw["x"],
            block_size=raw.get("b"),
            prefix=TextPrefix.from_json(raw.get("p")),
            tenant=raw.get("n") or "",
        )


@dataclass
class Captured:
    """What the router learns from decode's answer to build the next entry (filled in by
    upstream's filters as the answer passes)."""

    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    kv: dict[str, Any] | None = None
    choices: int = 0
