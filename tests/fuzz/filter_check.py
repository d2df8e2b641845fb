"""The stream filter's target: decode's events through StreamFilter, as the relay runs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdx_router.filters import StreamFilter
from pdx_router.ids import of_list

from . import sse
from .gen_sse import GOOD_KV
from .transport import pieces


def relay(
    stream: bytes, cuts: Sequence[int], capture: bool, strip_ids: bool, max_line: int
) -> tuple[bytes, StreamFilter]:
    """What the client gets of decode's stream read in these pieces: the relay stops at a
    dropped line (its error event follows), else flushes the filter at the end."""
    f = StreamFilter(capture=capture, strip_ids=strip_ids)
    f.max_line_bytes = max_line
    f.stop_at_drop = True
    out = []
    for block in pieces(stream, cuts):
        out.append(f.feed(block))
        if f.dropped:
            return b"".join(out), f
    out.append(f.flush())
    return b"".join(out), f


def _captured(f: StreamFilter) -> tuple[Any, ...]:
    cap = f.captured
    return (cap.prompt(None), cap.output_ids, cap.kv, f.dropped, f.broken)


def check_filter(
    stream: bytes, cuts: Sequence[int], capture: bool, strip_ids: bool, max_line: int, valid: bool
) -> None:
    """No router field reaches the client, for any split of any stream; the same bytes and
    capture for any split; and for a valid stream (`valid`), every event as the engine sent
    it less the router's fields, and the ids and kv captured."""
    out, f = relay(stream, (), capture, strip_ids, max_line)
    for data in sse.events(out):
        leaked = sse.router_fields(sse.parsed(data), strip_ids)
        assert not leaked, f"{leaked} reached the client in {data[:300]!r} of {stream[:600]!r}"
    if cuts:
        split, g = relay(stream, cuts, capture, strip_ids, max_line)
        for data in sse.events(split):
            leaked = sse.router_fields(sse.parsed(data), strip_ids)
            assert not leaked, f"{leaked} reached the client in {data[:300]!r} of {stream[:600]!r} cut at {cuts}"
        # What the client reads must not depend on the split (comments before a dropped line
        # may go or not); near the size bound, which event is cut may (see docs/fuzzing.md).
        if not (f.oversized or g.oversized):
            same = (sse.events(split), _captured(g)) == (sse.events(out), _captured(f))
            assert same, f"a split at {cuts} changed the filter's work on {stream!r}"
    if valid and len(stream) <= max_line:
        _check_valid(stream, out, f, capture, strip_ids)


def _check_valid(stream: bytes, out: bytes, f: StreamFilter, capture: bool, strip_ids: bool) -> None:
    sent = [sse.parsed(e) for e in sse.events(stream)]
    assert not f.dropped, f"a valid stream lost a line: {stream[:600]!r}"
    assert not f.broken or _bad_kv(sent), f"a valid stream was taken as broken: {stream[:600]!r}"
    got = [sse.parsed(e) for e in sse.events(out)]
    assert got == [sse.without_router_fields(e, strip_ids) for e in sent], f"events changed: {stream[:600]!r}"
    if not capture or any(isinstance(e, dict) and len(e.get("choices") or []) > 1 for e in sent):
        return
    outs: list[int] = []
    prompt: list[int] | None = None
    for e in sent:
        if not isinstance(e, dict):
            continue
        first = e["choices"][0] if e.get("choices") else {}
        outs += [int(i) for i in first.get("token_ids") or []]
        found = e.get("prompt_token_ids", first.get("prompt_token_ids"))
        prompt = prompt if prompt is not None or found is None else [int(i) for i in found]
    cap = f.captured
    assert cap.output_ids == outs, f"captured {cap.output_ids}, sent {outs}: {stream[:600]!r}"
    assert cap.prompt(None) == (of_list(prompt) if prompt is not None else None), f"prompt ids: {stream[:600]!r}"
    kvs = [e["kv_transfer_params"] for e in sent if isinstance(e, dict) and e.get("kv_transfer_params") is not None]
    expected = GOOD_KV if kvs and not _bad_kv(sent) else None
    assert cap.kv == expected, f"captured kv {cap.kv}: {stream[:600]!r}"


def _bad_kv(sent: list[Any]) -> bool:
    """Some event carries a kv_transfer_params that is neither null nor well formed."""
    return any(isinstance(e, dict) and e.get("kv_transfer_params") not in (None, GOOD_KV) for e in sent)
