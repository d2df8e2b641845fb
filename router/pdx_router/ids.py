"""Token ids as the engines write them: compact JSON text without the brackets, `1,2,3`.

Why text, not ints: a reused turn meets the same 8-32k ids three times (the /tokenize answer,
decode's prompt_token_ids, the stored entry). Parsed, every meeting makes a Python int per id
(orjson.loads of 8k ids: ~220 us here, packing them into an array another ~100 us). As text
the prefix check, the agreement check and the cut are bytes operations at C speed, and an id
costs its digits and a comma (~6 bytes for a 150k vocabulary) instead of 4.

The text is canonical (what `orjson.dumps` writes for a list of non-negative ints), so two
texts are equal exactly when their ids are; `of_json` accepts an engine's text as it is only
after checking that, and re-encodes anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NewType

import orjson

IdText = NewType("IdText", bytes)  # canonical ids, no brackets; b"" is no ids

EMPTY: Final = IdText(b"")
_DIGITS_AND_COMMAS: Final = b"0123456789,"


def of_list(ids: Sequence[int]) -> IdText:
    """The text of ids; ValueError for anything but non-negative ints (bools and floats too)."""
    try:
        t = orjson.dumps(ids if isinstance(ids, list) else list(ids))[1:-1]
    except TypeError:
        raise ValueError("not a token id list") from None
    if not _canonical(t):
        raise ValueError("not a token id list: ids are non-negative integers")
    return IdText(t)


def of_json(raw: bytes) -> IdText | None:
    """A JSON array of ids as an engine wrote it (`[1,2,3]`, any valid form), or None if it
    is not a list of token ids. The compact form is taken as it is, after a check at C speed."""
    inner = raw[1:-1]
    if raw[:1] == b"[" and raw[-1:] == b"]" and _canonical(inner):
        return IdText(inner)
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(value) is not list:
        return None
    if not all(type(x) is int for x in value):  # 7.0 and 7e0 are ids too, as JSON goes
        if not all(type(x) in (int, float) and float(x).is_integer() for x in value):
            return None
        value = [int(x) for x in value]
    try:
        return of_list(value)
    except ValueError:
        return None  # negative, or not a number


def _canonical(t: bytes) -> bool:
    """Digits and single commas, without leading zeros: what orjson writes for ints >= 0.
    (An id above any vocabulary is still a JSON int; the engine refuses it, nothing else.)"""
    if not t:
        return True
    if t.translate(None, _DIGITS_AND_COMMAS) or t[0] == 0x2C or t[-1] == 0x2C or t.find(b",,") >= 0:
        return False
    if (t[0] == 0x30 and t[1:2] not in (b"", b",")) or t.find(b",0") >= 0:
        # Rare (id 0 is a rare token): look at each id.
        return all(x == b"0" or x[:1] != b"0" for x in t.split(b","))
    return True


def count(t: bytes) -> int:
    return t.count(b",") + 1 if t else 0


def head(t: IdText, n: int, total: int | None = None) -> IdText:
    """The first n ids (all of them if there are fewer); `total`: how many t has, if known
    (counting commas is a pass over the text: ~45 us for 8k ids here)."""
    if n <= 0:
        return EMPTY
    total = count(t) if total is None else total
    if n >= total:
        return t
    if total - n < n:  # cut near the end: walk back from it
        end = len(t)
        for _ in range(total - n):
            end = t.rfind(b",", 0, end)
        return IdText(t[:end])
    end = -1
    for _ in range(n):
        end = t.find(b",", end + 1)
    return IdText(t[:end])


def join(a: IdText, b: IdText) -> IdText:
    return IdText(a + b"," + b) if a and b else (a or b)


def of_json_beside(raw: bytes, known: IdText) -> IdText | None:
    """of_json, for an array that mostly repeats ids already checked (a conversation's new
    prompt beside the ids held for it): only what follows the common part is checked."""
    inner = raw[1:-1]
    if raw[:1] != b"[" or raw[-1:] != b"]":
        return of_json(raw)
    start = inner.rfind(b",", 0, common_bytes(inner, known)) + 1  # the id the common part ends in
    return IdText(inner) if _canonical(inner[start:]) else of_json(raw)


def common_bytes(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of two byte strings (halving: C compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


def compare(held: IdText, held_n: int, prompt: IdText) -> tuple[int, bool, bool]:
    """(ids in common, held has more, prompt has more), given held's count: only commas past
    the common bytes are counted, so a prompt that extends held costs no pass over it."""
    d = common_bytes(held, prompt)
    if d == 0:
        return 0, bool(held), bool(prompt)
    before = held_n - 1 - held.count(b",", d)  # commas in held[:d]
    if held[d : d + 1] in (b"", b",") and prompt[d : d + 1] in (b"", b","):
        return before + 1, len(held) > d, len(prompt) > d
    return before, True, True  # both go on with ids of their own (they differ at d)


def common_prefix(a: IdText, b: IdText) -> int:
    """How many leading ids two texts share (compare's first answer, a's ids counted)."""
    return compare(a, count(a), b)[0]


def to_list(t: bytes) -> list[int]:
    result: list[int] = orjson.loads(b"[" + t + b"]")
    return result


def fragment(t: IdText) -> orjson.Fragment:
    """The ids as a JSON array inside a body orjson serialises, without parsing them."""
    return orjson.Fragment(b"[" + t + b"]")


def ends_with(t: IdText, tail: IdText) -> bool:
    """Are `tail` the last ids of t (whole ids: the byte before them is a comma, or none)?"""
    if not tail:
        return True
    return t.endswith(tail) and (len(t) == len(tail) or t[len(t) - len(tail) - 1] == 0x2C)
