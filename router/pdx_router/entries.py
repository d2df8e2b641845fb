"""What the router remembers about a conversation between turns."""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pdx_contract import kv_prefix

from . import ids
from .chat_tokens import TextPrefix
from .ids import IdText

# What an entry costs in memory beyond its ids, fitted with tracemalloc on entries of 64 to
# 16k tokens in blocks of 16 and 128 (within 6% from 1k tokens up): a fixed part (the
# dataclass, the kv dict, the store's key and bookkeeping), the kv's JSON size for its other
# fields, and each block id as a Python int in a list (~32 bytes: vLLM's blocks of 16 give a
# 16k-token entry 1024 of them). The ids are their text (`ids.IdText`): a byte each.
ENTRY_OVERHEAD_BYTES: Final = 1024
BLOCK_ID_BYTES: Final = 32

# The Redis value: a version byte, the length of the JSON header, the header, then the ids.
# Version 2 holds their text; version 1 (little-endian uint32s) and the JSON object of earlier
# routers (first byte `{`) are still read, so routers can be upgraded while Redis holds entries.
_TEXT_V2: Final = b"\x02"
_BINARY_V1: Final = b"\x01"
_HEADER_LEN: Final = struct.Struct("<I")


def _ids_from_le(data: bytes | memoryview) -> IdText:
    packed = array("I")
    packed.frombytes(data)
    if sys.byteorder != "little":
        packed.byteswap()
    return ids.of_list(packed.tolist())


@dataclass(frozen=True)
class Entry:
    """Decode's block metadata for one finished turn, plus what makes reusing it safe.

    token_ids are exactly the tokens whose KV decode holds (cut to remote_num_tokens), so the
    next turn can be compared token by token; they are their canonical text (`ids`), and a
    sequence of ints given instead is turned into it. They are empty when the engines check
    the prefix themselves (held_by_engines). Times are epoch seconds so that several
    router replicas sharing Redis agree on them.
    """

    kv: dict[str, Any]
    token_ids: IdText
    decode_url: str
    generation: str
    stored_at: float
    deadline: float
    block_size: int | None = None
    prefix: TextPrefix | None = None  # where the router's own tokenizer may resume (chat)
    tenant: str = ""  # whose entry it is: the store bounds each tenant's bytes
    turn: bytes | None = None  # the history digest of the turn decode holds (policy.history), if known

    def __post_init__(self) -> None:
        given: Any = self.token_ids
        if not isinstance(given, bytes):
            object.__setattr__(self, "token_ids", ids.of_list(given))

    @property
    def held_by_engines(self) -> bool:
        """Decode named the tokens it holds (`pdx_contract.kv_prefix`): prefill checks the
        prompt against them, and the entry holds no ids of its own."""
        return kv_prefix.HELD in self.kv

    @property
    def num_tokens(self) -> int:
        n = kv_prefix.held_tokens(self.kv) if self.held_by_engines else self.kv.get("remote_num_tokens")
        return n if isinstance(n, int) else 0

    def nbytes(self) -> int:
        """What this entry costs the memory store, estimated once when it is put: its ids, its
        kv (JSON size plus its block ids as Python ints), its strings, a fixed overhead."""
        groups = self.kv.get("remote_block_ids")
        blocks = sum(len(g) for g in groups if isinstance(g, list)) if isinstance(groups, list) else 0
        return (
            len(self.token_ids)
            + len(orjson.dumps(self.kv))
            + blocks * BLOCK_ID_BYTES
            + len(self.decode_url)
            + len(self.generation)
            + len(self.tenant)
            + (len(self.turn) if self.turn is not None else 0)
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
                "h": self.turn.hex() if self.turn is not None else None,
            }
        )
        return b"".join((_TEXT_V2, _HEADER_LEN.pack(len(header)), header, self.token_ids))

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Entry:
        if isinstance(data, str):
            data = data.encode()
        if data[:1] in (_TEXT_V2, _BINARY_V1):
            (n,) = _HEADER_LEN.unpack_from(data, 1)
            start = 1 + _HEADER_LEN.size
            raw = orjson.loads(data[start : start + n])
            held = IdText(data[start + n :]) if data[:1] == _TEXT_V2 else _ids_from_le(memoryview(data)[start + n :])
        else:  # the JSON form of earlier routers
            raw = orjson.loads(data)
            held = ids.of_list(raw["t"])
        return cls(
            kv=raw["kv"],
            token_ids=held,
            decode_url=raw["d"],
            generation=raw["g"],
            stored_at=raw["s"],
            deadline=raw["x"],
            block_size=raw.get("b"),
            prefix=TextPrefix.from_json(raw.get("p")),
            tenant=raw.get("n") or "",
            turn=_turn(raw.get("h")),
        )


def _turn(raw: Any) -> bytes | None:
    """A stored history digest; anything else (an older router's entry: none) is unknown."""
    if not isinstance(raw, str):
        return None
    try:
        return bytes.fromhex(raw)
    except ValueError:
        return None


@dataclass
class Captured:
    """What the router learns from decode's answer to build the next entry (filled in by
    upstream's filters as the answer passes)."""

    prompt_ids: IdText | None = None  # checked text (see prompt)
    output_ids: list[int] | None = None  # a few per chunk, as ints
    kv: dict[str, Any] | None = None
    choices: int = 0
    prompt_raw: bytes | None = None  # decode's JSON array as it came, unchecked (see prompt)

    def prompt(self, compared: IdText | None) -> IdText | None:
        """Decode's prompt ids as text. The array as it came is taken when it is the ids the
        prefix check compared (equal text is equal ids: nothing to check, the usual hit),
        else checked once (ids.of_json); None if it is not a list of ids."""
        if self.prompt_raw is not None:
            raw, self.prompt_raw = self.prompt_raw, None
            same = compared is not None and raw[1:-1] == compared and raw[:1] == b"[" and raw[-1:] == b"]"
            self.prompt_ids = compared if same else ids.of_json(raw)
        return self.prompt_ids
