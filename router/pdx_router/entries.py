"""What the router remembers about a conversation between turns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .chat_tokens import TextPrefix


@dataclass(frozen=True)
class Entry:
    """Decode's block metadata for one finished turn, plus what makes reusing it safe.

    token_ids are exactly the tokens whose KV decode holds (cut to remote_num_tokens), so the
    next turn can be compared token by token. Times are epoch seconds so that several router
    replicas sharing Redis agree on them.
    """

    kv: dict[str, Any]
    token_ids: list[int]
    decode_url: str
    generation: str
    stored_at: float
    deadline: float
    block_size: int | None = None
    prefix: TextPrefix | None = None  # where the router's own tokenizer may resume (chat)

    @property
    def num_tokens(self) -> int:
        n = self.kv.get("remote_num_tokens")
        return n if isinstance(n, int) else 0

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "kv": self.kv,
                "t": self.token_ids,
                "d": self.decode_url,
                "g": self.generation,
                "s": self.stored_at,
                "x": self.deadline,
                "b": self.block_size,
                "p": self.prefix.to_json() if self.prefix is not None else None,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes | str) -> Entry:
        raw = orjson.loads(data)
        return cls(
            kv=raw["kv"],
            token_ids=raw["t"],
            decode_url=raw["d"],
            generation=raw["g"],
            stored_at=raw["s"],
            deadline=raw["x"],
            block_size=raw.get("b"),
            prefix=TextPrefix.from_json(raw.get("p")),
        )


@dataclass
class Captured:
    """What the router learns from decode's answer to build the next entry (filled in by
    upstream's filters as the answer passes)."""

    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    kv: dict[str, Any] | None = None
    choices: int = 0
