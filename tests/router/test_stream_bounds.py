"""The stream filter's bounds and SSE's multi-line events: time linear in the bytes relayed,
one event above the limit caught however it arrives, an event's data split over lines."""

from __future__ import annotations

import time

import orjson
import pytest

from pdx_router.filters import StreamFilter, well_formed_kv
from pdx_router.ids import of_list

KV = {"remote_block_ids": [[1, 2]], "remote_num_tokens": 20, "remote_blocks_expiry_time": 9.0}
# One chat chunk whose JSON is broken over three data: lines (SSE joins them with "\n").
SPLIT = (
    b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"},\n'
    b'data: "token_ids":[11]}],\n'
    b'data: "prompt_token_ids":[5,6],"kv_transfer_params":' + orjson.dumps(KV) + b"}\n\n"
    b"data: [DONE]\n\n"
)


def _run(blocks: list[bytes], max_line: int | None = None) -> tuple[bytes, StreamFilter]:
    f = StreamFilter(capture=True, strip_ids=True)
    if max_line is not None:
        f.max_line_bytes = max_line
    return b"".join(f.feed(b) for b in blocks) + f.flush(), f


def _client_view(out: bytes) -> list[object]:
    """What an SSE client reads: each event's data lines joined with "\\n", as JSON."""
    events = []
    for block in out.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
        data = [ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if data:
            value = b"\n".join(data)
            events.append("[DONE]" if value == b"[DONE]" else orjson.loads(value))
    return events


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_an_event_split_over_data_lines_is_captured_and_stripped_wherever_the_reads_cut(eol: bytes) -> None:
    stream = SPLIT.replace(b"\n", eol)
    for cut in [*range(1, len(stream)), len(stream)]:
        out, f = _run([stream[:cut], stream[cut:]])
        assert f.captured.kv == KV and f.captured.output_ids == [11] and f.captured.prompt(None) == of_list([5, 6]), cut
        assert not f.broken and not f.dropped, cut
        assert _client_view(out) == [{"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}}]}, "[DONE]"]


def test_an_event_split_over_data_lines_that_names_nothing_passes_as_it_came() -> None:
    plain = b'data: {"id":"x",\ndata: "choices":[]}\n\ndata: [DONE]\n\n'
    out, f = _run([plain[:9], plain[9:]])
    assert out == plain and not f.broken


def test_an_event_split_over_data_lines_that_is_not_json_is_dropped_and_the_turn_not_kept() -> None:
    bad = b'data: {"choices":[],\ndata: "kv_transfer_params":' + orjson.dumps(KV) + b",}\n\ndata: [DONE]\n\n"
    out, f = _run([bad])
    assert f.dropped == 1 and f.captured.kv is None and b"kv_transfer_params" not in out
    # cut short at the end of the stream, without its empty line: dropped too
    out, f = _run([b'data: {"id":"x",\ndata: "choices":['])
    assert out == b"" and f.dropped == 1


def test_an_event_above_the_limit_that_arrives_in_one_read_ends_the_stream() -> None:
    big = b'data: {"a":1}\n\ndata: {"pad":"' + b"x" * 200 + b'"}\n\ndata: [DONE]\n\n'
    out, f = _run([big], max_line=100)
    assert f.oversized and f.dropped == 1 and f.captured.kv is None
    assert out == b'data: {"a":1}\n\n'  # what came before it, and nothing after


def _relay_seconds(size: int, read: int = 64 << 10) -> float:
    head = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
    tail = b'"},"token_ids":[11]}]}\n\n'
    event = head + b"a" * (size - len(head) - len(tail)) + tail
    best = float("inf")
    for _ in range(3):
        f = StreamFilter(capture=True, strip_ids=True)
        t0 = time.perf_counter()
        out = [f.feed(event[i : i + read]) for i in range(0, len(event), read)]
        best = min(best, time.perf_counter() - t0)
        assert f.captured.output_ids == [11] and len(b"".join(out)) == size - len(b',"token_ids":[11]')
    return best


def test_a_long_event_costs_time_linear_in_its_size() -> None:
    # Four times the bytes in the same 64 KiB reads: about four times the time, not sixteen
    # (re-reading what is held at every read made it quadratic: 32 MiB took 14 s).
    small, large = _relay_seconds(4 << 20), _relay_seconds(16 << 20)
    assert large < 8 * small, (small, large)


def test_a_token_count_written_as_a_float_is_refused_like_any_wrong_shape() -> None:
    # kv_transfer_params go back to the engines as they came: a connector that slices by
    # remote_num_tokens needs an int, so 20.0 is malformed (ids, which the router reads itself,
    # may be spelled 11.0: it converts them).
    kv = {**KV, "remote_num_tokens": 20.0}
    assert not well_formed_kv(kv)
    stream = b'data: {"choices":[],"kv_transfer_params":' + orjson.dumps(kv) + b"}\n\ndata: [DONE]\n\n"
    out, f = _run([stream])
    assert f.captured.kv is None and f.broken and b"kv_transfer_params" not in out


def test_the_size_bound_counts_an_event_from_its_first_data_line_however_it_is_split() -> None:
    """A comment before the data line is not counted: it has gone when an event is held across
    reads, so counting it in one read made the same stream cut or not by where it was split."""
    line = b'data: {"choices":[{"delta":{"content":"' + b"x" * 300 + b'"}}]}\n'
    stream = b": keep-alive\n" + line + b"\n" + b"data: [DONE]\n\n"
    limit = len(line) + 5  # the event fits; with its comment line it would not
    whole, f = _run([stream], limit)
    split, g = _run([stream[:20], stream[20:200], stream[200:]], limit)
    assert not f.oversized and not g.oversized
    assert _client_view(whole) == _client_view(split) and whole.endswith(b"data: [DONE]\n\n")


def test_an_event_rewritten_in_one_line_keeps_the_empty_line_that_ends_it() -> None:
    """Data lines ended by a CR, then an LF: the rewritten line took the first one's CR,
    which with the empty line's LF made a CRLF, so the event ran on into [DONE]."""
    stream = b'data: {"id":"x",\rdata: "kv_transfer_params":{"remote_block_ids":[[1]]}}\n\ndata: [DONE]\n\n'
    out, _ = _run([stream])
    assert _client_view(out) == [{"id": "x"}, "[DONE]"]
