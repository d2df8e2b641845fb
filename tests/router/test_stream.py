"""The stream filter gets socket blocks split anywhere; the result must not depend on where."""

from __future__ import annotations

import orjson

from pdx_router.filters import StreamFilter
from pdx_router.ids import of_list

KV = {"remote_block_ids": [[1, 2]], "remote_num_tokens": 20, "remote_blocks_expiry_time": 9.0}


def _event(obj: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


STREAM = b"".join(
    [
        _event({"id": "x", "choices": [{"delta": {"content": ""}}], "prompt_token_ids": [5, 6, 7]}),
        _event({"id": "x", "choices": [{"delta": {"content": 'a "token_ids":[9]'}, "token_ids": [11]}]}),
        _event({"id": "x", "choices": [{"delta": {"content": "b"}, "token_ids": [12]}]}),
        _event({"id": "x", "choices": [{"delta": {"content": ""}, "token_ids": [2]}], "kv_transfer_params": KV}),
        b"data: [DONE]\n\n",
    ]
)


def _run(blocks: list[bytes], capture: bool = True, strip_ids: bool = True) -> tuple[bytes, StreamFilter]:
    f = StreamFilter(capture=capture, strip_ids=strip_ids)
    out = b"".join(f.feed(b) for b in blocks) + f.flush()
    return out, f


def test_any_split_gives_the_same_bytes_and_capture() -> None:
    whole, ref = _run([STREAM])
    assert b'token_ids":[' not in whole.replace(b'\\"token_ids\\":[9]', b"")
    assert b"kv_transfer_params" not in whole and whole.endswith(b"data: [DONE]\n\n")
    assert ref.captured.prompt(None) == of_list([5, 6, 7]) and ref.captured.output_ids == [11, 12, 2]
    assert ref.captured.kv == KV
    ref.captured.prompt(None)
    for cut in range(1, len(STREAM)):
        out, f = _run([STREAM[:cut], STREAM[cut:]])
        assert out == whole, cut
        f.captured.prompt(None)
        assert f.captured == ref.captured, cut


def test_byte_at_a_time_matches() -> None:
    out, f = _run([STREAM[i : i + 1] for i in range(len(STREAM))])
    whole, ref = _run([STREAM])
    f.captured.prompt(None), ref.captured.prompt(None)
    assert out == whole and f.captured == ref.captured


def test_ids_kept_when_the_client_asked_for_them() -> None:
    out, f = _run([STREAM], capture=True, strip_ids=False)
    assert b'"token_ids":[11]' in out and b"kv_transfer_params" not in out
    assert f.captured.output_ids == [11, 12, 2]


def test_a_stream_cut_inside_the_last_event_is_not_stored() -> None:
    cut = STREAM.index(b'"kv_transfer_params"') + 30
    out, f = _run([STREAM[:cut]])
    assert b"kv_transfer_params" not in out
    assert f.captured.kv is None


def test_a_data_field_without_its_colon_is_held_with_its_event_however_the_stream_is_split() -> None:
    """SSE reads a bare "data" line as an empty data value: held from it, like the other data
    lines, an event dropped whole by the filter is dropped alike in any split."""
    event = b'retry: 1\ndata\rdata: {"kv_transfer_params":\ndata: oops}\n\ndata: [DONE]\n\n'
    for cut in range(1, len(event)):
        f = StreamFilter(capture=True, strip_ids=True)
        f.stop_at_drop = True
        out = b""
        for block in (event[:cut], event[cut:]):
            out += f.feed(block)
            if f.dropped:
                break
        assert b"data\r" not in out and b"kv_transfer_params" not in out, cut


def test_a_field_line_naming_a_field_drops_its_event_however_the_stream_is_split() -> None:
    """Read line by line (a split before the data lines) the field line is dropped as one that
    may carry what the client must not see; read whole, the event was passed (its data parsed
    and cut, the field line as it came): now it is dropped alike."""
    event = b'retry: 1\\u0069\ndata: {"kv_transfer_params":\ndata: {"remote_block_ids":[[1]]}}\n\ndata: [DONE]\n\n'
    for cut in range(0, len(event)):
        f = StreamFilter(capture=True, strip_ids=True)
        f.stop_at_drop = True
        out = b""
        for block in (event[:cut], event[cut:]) if cut else (event,):
            out += f.feed(block)
            if f.dropped:
                break
        assert f.dropped == 1 and b"remote_block_ids" not in out, cut


def test_token_ids_right_after_the_opening_brace_is_parsed_not_cut_as_bytes() -> None:
    """The byte path looked 8 bytes back for `"prompt_`: at `data: {token_ids` that slice
    starts at -1, which compiled raised SystemError (pure Python read it as empty)."""
    f = StreamFilter(capture=True, strip_ids=True)
    out = f.line(b'data: {token_ids\\":[1"id":1}\n')
    assert out == b"" and f.dropped == 1  # not JSON: dropped as unreadable, as any such line
