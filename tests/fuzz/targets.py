"""The fuzz targets, one input each: drawn (generated, or a corpus entry mutated) and checked.
The tests run them under hypothesis, scripts/fuzz.py in a plain loop, millions of times."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import orjson

from . import gen_body, gen_http, gen_sse
from .checks import check_front, check_http1, check_wire
from .draw import Draw
from .filter_check import check_filter
from .shapes_check import FRONTS, check_shapes

CORPUS = Path(__file__).parent / "corpus"
MAX_LINES = (64 << 20, 400, 2000)  # the router's bound, and small ones an input can reach
LAST: list[object] = []  # the last input checked, for the long run's report of a failure
METHODS = ("GET", "POST", "PATCH", "HEAD", "DELETE")


@cache
def _seeds(where: str) -> tuple[bytes, ...]:
    return tuple(p.read_bytes() for p in sorted((CORPUS / where).glob("*")))


def _bytes(d: Draw, where: str, make: Callable[[], bytes]) -> bytes:
    """A generated input, or now and then a corpus entry with a few bytes changed."""
    seeds = _seeds(where)
    if seeds and d.chance(0.25):
        return gen_http.mutate(d, d.choice(seeds))
    return make()


def front(d: Draw) -> None:
    raw = _bytes(d, "requests", lambda: gen_http.stream(d))
    cuts = gen_http.cuts(d, raw)
    LAST[:] = [raw, cuts]
    check_front(raw, cuts)


def wire(d: Draw) -> None:
    raw = _bytes(d, "answers", lambda: gen_http.stream(d, answers=True))
    cuts = gen_http.cuts(d, raw)
    LAST[:] = [raw, cuts]
    check_wire(raw, cuts)


def http1(d: Draw) -> None:
    raw = _bytes(d, "answers", lambda: gen_http.stream(d, answers=True))
    methods = [d.choice(METHODS) for _ in range(d.integer(1, 3))]
    cuts = gen_http.cuts(d, raw)
    LAST[:] = [raw, methods, cuts]
    check_http1(raw, methods, cuts)


def stream_filter(d: Draw) -> None:
    valid = not d.chance(0.3)
    stream = gen_sse.sse(d, gen_sse.events(d))
    if not valid:
        stream = _bytes(d, "streams/malformed", lambda: gen_http.mutate(d, stream))
    capture, strip_ids, cuts, max_line = d.chance(0.7), d.chance(0.8), gen_http.cuts(d, stream), d.choice(MAX_LINES)
    LAST[:] = [stream, cuts, capture, strip_ids, max_line, valid]
    check_filter(stream, cuts, capture, strip_ids, max_line, valid)


def shapes(d: Draw) -> None:
    seeds = _seeds("bodies")
    body = orjson.loads(d.choice(seeds)) if seeds and d.chance(0.1) else gen_body.body(d)
    names = ("Authorization", "authorization", "X-Session-ID", "X-Tenant")
    headers = [(d.choice(names), d.choice(("Bearer k", "Bearer ", "", "s", "会"))) for _ in range(d.integer(0, 3))]
    is_chat, front = d.chance(0.7), d.choice(FRONTS)
    LAST[:] = [body, headers, is_chat, front]
    check_shapes(body, headers, is_chat, front)


TARGETS: dict[str, Callable[[Draw], None]] = {
    "front": front, "wire": wire, "http1": http1, "filter": stream_filter, "shapes": shapes,
}  # fmt: skip
