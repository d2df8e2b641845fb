"""Find a `/v1/completions` conversation from its prompt, for clients that send no id.

A stored turn is the prompt the router was sent, then what decode generated: after a text
prompt the answer's text, without the whitespace it ends in (clients strip it); after a prompt
of token ids the generated ids but the last, which decode computed no KV for (a client that
sends it back and one that drops it both continue the turn). The entry's key is the digest of
those bytes (a prompt of ids as their canonical text, `ids.py`, each id followed by a comma,
so a prefix ends between ids).

A later prompt that continues the turn starts with those bytes, but where they end in it is
unknown: no message boundary tells. So the store keeps an index beside the entries: under the
digest of a stored turn's head (its first C bytes, C the largest checkpoint at or below its
length) the lengths of the turns listed there, the 8 most recent (`store.HEAD_ENTRIES`). A
lookup reads the index under each checkpoint its own prompt reaches, then tries the digests of
its prefixes of the lengths found, longest first (at most `MAX_KEYS`, in one atomic
`take_first`). The checkpoints grow by 2^(1/4) from 256 bytes, so that is 4 index reads per
doubling of the prompt (36 at 100 kB) and one hashing pass for the heads, one for the
candidates: bounded, never a scan.

A turn's head holds all but its last sixth: conversations sharing a long system prompt get
heads of their own once their own part is a fifth of it; until then they share one index,
and only its 8 most recent turns are found. A near match is harmless: the router compares a
prompt's ids with those decode holds, or prefill checks its blocks' digests (the pdx plugin),
and reads only what matches.

Every digest starts from the tenant and KV scope, so a key names one tenant's turn in one
scope; keys are `p` or `h` and 32 hex digits, which no id's or chat history's key (64 hex
digits) can be.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from .. import ids
from ..ids import IdText

if TYPE_CHECKING:
    from hashlib import _Hash

HEAD_BYTES: Final = 256  # the first checkpoint above 0
MAX_KEYS: Final = 16  # prefixes tried per request, the longest first (two heads' worth)
DIGEST_BYTES: Final = 16
# 0, then 256 bytes growing by 2^(1/4): far past any request the router accepts.
CHECKPOINTS: Final = (0, *sorted({int(HEAD_BYTES * 2 ** (k / 4)) for k in range(4 * 40)}))

_TEXT: Final = b"pdx-prompt-v1 text\x00"
_IDS: Final = b"pdx-prompt-v1 ids\x00"
_ENTRY: Final = "p"  # an entry's key: this and its digest in hex
_HEAD: Final = "h"  # a head's index's


def checkpoint(length: int) -> int:
    """The largest checkpoint at or below `length`: where a turn of that length's head ends."""
    return CHECKPOINTS[bisect_right(CHECKPOINTS, length) - 1]


def _cut(h: _Hash) -> bytes:
    """SHA-256, cut to 16 bytes, as the chat history's."""
    return h.digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class Turn:
    """Where a finished turn is kept: its entry's digest, its head's, and its length."""

    digest: bytes
    head: bytes
    length: int

    @property
    def key(self) -> str:
        return _ENTRY + self.digest.hex()

    @property
    def head_key(self) -> str:
        return _HEAD + self.head.hex()


@dataclass(frozen=True)
class Prompt:
    """A completions prompt's bytes and its heads' digests (one per checkpoint it reaches)."""

    data: bytes  # the text as UTF-8, or the ids' text with a comma after each id
    start: bytes  # the domain (text or ids), the tenant and the KV scope the digests start from
    heads: tuple[bytes, ...]  # the digest of data[:c] for each checkpoint c <= len(data), the longest first
    # The hash's state at each of those checkpoints, the shortest first: a prefix's digest
    # resumes from the last one before it, so a lookup hashes little past the heads' pass.
    states: tuple[_Hash, ...] = field(repr=False, compare=False)

    @property
    def of_ids(self) -> bool:
        return self.start.startswith(_IDS)

    @property
    def ids(self) -> IdText | None:
        """A prompt of ids: their text (what the router compares with what decode holds)."""
        return IdText(self.data[:-1]) if self.of_ids else None

    def _digests(self, data: bytes, ends: Sequence[int]) -> list[bytes]:
        """The digests of data[:n] for each n of the ascending `ends`, each hash resumed from
        the last checkpoint state before it; `data` starts with this prompt's bytes, or is a
        prefix of them."""
        shared = min(len(data), len(self.data))
        view = memoryview(data)
        out: list[bytes] = []
        h, at = self.states[0], -1
        for n in ends:
            c = bisect_right(CHECKPOINTS, min(n, shared)) - 1
            if CHECKPOINTS[c] > at:  # a state further on than the running hash: take it
                h, at = self.states[c].copy(), CHECKPOINTS[c]
            h.update(view[at:n])
            at = n
            out.append(_cut(h))
        return out

    def head_keys(self) -> tuple[str, ...]:
        """The store keys of the heads' indexes, the longest first."""
        return tuple(_HEAD + h.hex() for h in self.heads)

    def keys(self, lengths: Iterable[int]) -> tuple[str, ...]:
        """The store keys of the candidates of these lengths, the longest first."""
        return tuple(_ENTRY + d.hex() for _, d in self.candidates(lengths))

    def candidates(self, lengths: Iterable[int]) -> list[tuple[int, bytes]]:
        """(length, digest) of the prefixes of these lengths that could be stored turns, the
        longest first, at most MAX_KEYS. A prefix of ids must end after a comma."""
        data, size = self.data, len(self.data)
        fits = {n for n in lengths if 0 < n <= size and (not self.of_ids or data[n - 1] == 0x2C)}
        chosen = sorted(fits, reverse=True)[:MAX_KEYS]
        chosen.reverse()
        return list(zip(chosen, self._digests(data, chosen), strict=True))[::-1]

    def turn(self, answer: Mapping[str, Any] | None, output_ids: Sequence[int] | None) -> Turn | None:
        """The stored turn after this prompt: with the answer's text (a text prompt), or the
        generated ids (a prompt of ids); None if decode's answer did not tell them."""
        if self.of_ids:
            if not output_ids:
                return None
            try:
                held = ids.of_list(output_ids[:-1])
            except ValueError:
                return None
            whole = self.data + held + b"," if held else self.data
        else:
            text = answer.get("text") if answer is not None else None
            if not isinstance(text, str):
                return None
            said = text.rstrip()
            if said:
                whole = self.data + said.encode(errors="surrogatepass")
            else:  # nothing but whitespace: the prompt, without the whitespace it ends in
                whole = self.data.decode(errors="surrogatepass").rstrip().encode(errors="surrogatepass")
        if not whole:
            return None
        head, digest = self._digests(whole, (checkpoint(len(whole)), len(whole)))
        return Turn(digest, head, len(whole))


def _prompt(start: bytes, data: bytes) -> Prompt:
    """One pass over the prompt, keeping the hash's state at each checkpoint it reaches."""
    h = hashlib.sha256(start)
    view = memoryview(data)
    states: list[_Hash] = []
    at = 0
    for c in CHECKPOINTS[: bisect_right(CHECKPOINTS, len(data))]:
        h.update(view[at:c])
        at = c
        states.append(h.copy())
    return Prompt(data, start, tuple(_cut(x) for x in reversed(states)), tuple(states))


def _start(domain: bytes, tenant: str, scope: str) -> bytes:
    return domain + f"{tenant}\x00{scope}\x00".encode(errors="surrogatepass")


def of_text(prompt: str, tenant: str, scope: str) -> Prompt:
    return _prompt(_start(_TEXT, tenant, scope), prompt.encode(errors="surrogatepass"))


def of_ids(prompt: IdText, tenant: str, scope: str) -> Prompt:
    return _prompt(_start(_IDS, tenant, scope), prompt + b",")


def of_body(body: Mapping[str, Any], tenant: str, scope: str) -> Prompt | None:
    """A single prompt, text or ids; None for a batch, an empty prompt, or `echo` (its text
    repeats the prompt, so it names no turn a client continues)."""
    if body.get("echo"):
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return of_text(prompt, tenant, scope) if prompt else None
    if isinstance(prompt, list) and prompt:
        try:
            return of_ids(ids.of_list(prompt), tenant, scope)
        except ValueError:
            return None  # a batch, or not token ids (of_list checks each)
    return None
