"""Cheap surgery on decode's answers: what the client must not see is cut, what the router
needs is captured.

Stream chunks are passed through as bytes. Only the fields the router itself asked for are
cut out: by byte search when the line is vLLM's compact JSON (a structural `"token_ids":[`
cannot occur inside a JSON string, where quotes are escaped), else by parsing the line, so
any valid JSON form (spaces, key order, escaped keys, other number forms) reads the same.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from . import scan
from .entries import Captured
from .errors import NotCompact
from .ids import IdText, of_list

# What a line must contain to be worth a look, in any JSON form: a field's bare name, or a
# \u escape (a key may be spelled `"token\u005fids"`).
_KV_NAME: Final = b"kv_transfer_params"
_ID_NAME: Final = b"token_ids"  # in both id fields: one search rules both out
_ESCAPE: Final = b"\\u"
_PROMPT: Final = b'"prompt_'
_DATA_OBJ: Final = b"data: {"
_ONE_ID: Final = re.compile(rb',"token_ids":\[(0|[1-9][0-9]{0,9})\]')  # one id, as vLLM writes it
_INT_LIST: Final = b"0123456789,[]"  # what a compact list of ints is made of
_MISSING: Any = object()
_DIGITS_COMMAS: Final = b"0123456789,"  # a JSON list of non-negative ints, its brackets taken off
_BLANK: Final = (b"\n\n", b"\n\r", b"\r\r")  # a line end, then an empty line: an SSE event ends
_EOLS: Final = (b"\n", b"\r\n", b"\r")  # an empty line, as splitlines() gives it
_DATA_LINE: Final = re.compile(rb"(?:(?<=[\r\n])|^)data(?=[:\r\n])")  # a line whose field is data
# The fast path's one search per block (scan.c when built); held in statics, not looked up.
_marks: Final = scan.marks
_NAMED: Final = scan.KV | scan.BACKSLASH
_NOT_ONE_LINE: Final = scan.LINES | scan.CR
_IDS: Final = scan.IDS
# The most of one engine answer the router holds in memory: a non-streamed answer, or one
# line of a stream (a prefill answer is one token; a long decode answer with logprobs is a
# few MB). Above it the answer is malformed: the turn fails with 502, nothing is stored.
MAX_ANSWER_BYTES: Final = 64 << 20
_MAX_TOKENS: Final = 1 << 31  # no context is this long: a count above it is not a count


def token_ids(value: Any) -> list[int] | None:
    """An id list as JSON may spell it (`7`, `7.0`, `7e0`), or None if it is not one."""
    if type(value) is not list:
        return None
    if all(type(x) is int for x in value):
        return value
    if all(type(x) is float and x.is_integer() for x in value if type(x) is not int):
        return [int(x) for x in value]
    return None


def well_formed_kv(kv: Any) -> bool:
    """kv_transfer_params as vLLM's connector writes them: an object whose block ids are a
    list of groups of non-negative ints and whose token count is a non-negative int (both
    may be null). Anything else is never passed on nor stored."""
    if type(kv) is not dict:
        return False
    blocks = kv.get("remote_block_ids")
    if blocks is not None and not (type(blocks) is list and all(_block_group(g) for g in blocks)):
        return False
    n = kv.get("remote_num_tokens")
    if n is not None and not (type(n) is int and 0 <= n < _MAX_TOKENS):
        return False
    for name in ("remote_engine_id", "remote_request_id", "remote_host"):
        if kv.get(name) is not None and type(kv[name]) is not str:
            return False
    port = kv.get("remote_port")
    return port is None or (type(port) is int and 0 < port < 65536)


def _block_group(g: Any) -> bool:
    """A list of non-negative ints (not bools, floats or lists), checked as its JSON text:
    decode's groups hold a block id per 16 or so tokens, thousands in a long conversation,
    checked twice a turn (prefill's answer, decode's). 3-4 µs for 520 ids against ~45 µs for
    a check of each id's type and the minimum."""
    if type(g) is not list:
        return False
    try:
        text = orjson.dumps(g)
    except orjson.JSONEncodeError:
        return False  # an int beyond 64 bits, or something JSON has no form for
    return not text[1:-1].translate(None, _DIGITS_COMMAS)


def _json_start(line: bytes) -> int:
    """Where the JSON object of an SSE `data:` line starts (after `data:`, one optional space
    and any JSON whitespace), or -1 if the line is not such a line."""
    if line.startswith(b"data: {"):
        return 6
    if not line.startswith(b"data:"):
        return -1
    i = 5
    while line[i : i + 1] in (b" ", b"\t"):
        i += 1
    return i if line[i : i + 1] == b"{" else -1


def _eol(line: bytes) -> bytes:
    return line[len(line.rstrip(b"\r\n")) :]


def _data_value(line: bytes) -> bytes:
    """A data line's value as SSE reads it: after `data:` and one optional space."""
    value = line[5:].rstrip(b"\r\n")
    return value[1:] if value[:1] == b" " else value


def _events_end(buf: bytes) -> int:
    """Where the last whole event of buf ends (after the empty line that ends it), or 0."""
    i = buf.rfind(b"\n")
    if i > 0 and buf[i - 1] != 0x0A:
        i = buf.rfind(b"\n\n", 0, i)
    else:
        i -= 1
    end = i + 2 if i >= 0 else 0
    start = max(end - 1, 0)
    if buf.find(b"\r", start) >= 0:  # an empty line that ends in CR (CR or CRLF line ends)
        for blank in (b"\n\r", b"\r\r"):
            j = buf.rfind(blank, start)
            if j >= 0 and j + 2 > end:
                end = j + 3 if buf[j + 2 : j + 3] == b"\n" else j + 2
    return end


def _first_data_line(buf: bytes) -> int:
    """Where the first line of buf that is a data line starts, or -1. A line that is the
    field name alone ("data" and its line end) is one too: SSE reads it as an empty data
    value, and held like the others, an event reads alike however the stream was split."""
    found = _DATA_LINE.search(buf)
    return -1 if found is None else found.start()


def _multi_data(block: bytes) -> bool:
    """Does a line of block that is not empty run on into a data line (so one event may have
    several data lines)? A step per line: vLLM's events are a data line and an empty one."""
    if block.find(b"\r") >= 0:
        return True  # CR line ends: go event by event, which reads them all
    if len(block) <= 1 << 16 and block.count(b"\n") == 2 * block.count(b"\n\n"):
        return False  # every run of line ends is even: each line is followed by an empty one
    i = block.find(b"\n")
    while 0 <= i < len(block) - 1:
        nxt = block.find(b"\n", i + 1)
        if nxt != i + 1 and block.startswith(b"data:", i + 1) and i > 0 and block[i - 1] != 0x0A:
            return True
        i = nxt
    return False


class StreamFilter:
    """Rewrites decode's SSE lines for the client and captures token ids and kv params.

    Lines in vLLM's compact JSON are cut as bytes: a `token_ids` occurrence that is exactly
    a compact `{"token_ids":[..]` / `,"prompt_token_ids":null` member is a key (the quote before
    it is unescaped and follows `{` or `,`, so it cannot sit inside a string). A line that
    names a field in any other way (spaces, an escaped key, the name inside a string), or
    carries kv_transfer_params, is parsed and re-encoded; a line naming neither passes as is.
    """

    def __init__(self, capture: bool, strip_ids: bool) -> None:
        self.capture = capture
        self.strip_ids = strip_ids
        self.captured = Captured(output_ids=[] if capture else None)
        self.broken = False  # a line could not be read: the turn must not be stored
        self.oversized = False  # a line grew past max_line_bytes: the stream is malformed
        self.dropped = 0  # lines dropped as unreadable: the client's answer is missing them
        self.stop_at_drop = False  # the relay ends the stream at a dropped line: nothing after it
        self.max_line_bytes = MAX_ANSWER_BYTES
        self._ids = capture or strip_ids
        self._held: list[bytes] = []  # what waits for the next block (see feed)
        self._held_len = 0
        self._event = False  # what is held starts at a data line of an event under way

    def feed(self, data: bytes) -> bytes:
        """Filter whatever block the socket delivered, so the relay writes once per block
        rather than once per SSE line. An unfinished line, or an event not yet ended by its
        empty line from its first data line on, waits for the next block: kept as the blocks
        came and joined once, when it is whole, so a long event costs time linear in its size."""
        whole = not self._held and data.endswith(b"\n\n") and not self.oversized and len(data) <= self.max_line_bytes
        # Whole events naming no field (most of a stream): as _take and _ready would, in one step.
        found = _marks(data) if whole else 0
        if whole and not found & _NAMED:
            if not self._ids or not found & _IDS:
                self._event = False
                return data
            if not found & _NOT_ONE_LINE and data.startswith(_DATA_OBJ):
                try:  # a streamed token's event: one compact data line (see _ready)
                    out = self._compact(data)
                    self._event = False
                    return out
                except NotCompact:
                    pass
        if self.oversized or not data:
            return b""  # the relay ends the stream
        if self._held:
            if not self._completes(self._held[-1][-1:], data):
                self._held.append(data)
                self._held_len += len(data)
                if self._held_len > self.max_line_bytes:
                    self._oversize()
                return b""
            data = b"".join([*self._held, data])
            self._held, self._held_len = [], 0
        return self._take(data)

    def _completes(self, last: bytes, data: bytes) -> bool:
        """Does `data` finish what is held: the event (an empty line), or else the line?"""
        lf, cr = data.find(b"\n"), data.find(b"\r")  # one-byte searches: the fastest there are
        if not self._event or (lf < 0 and cr < 0):
            return lf >= 0 or cr >= 0
        return last + data[:1] in _BLANK or any(data.find(b, max(min(lf, cr), 0)) >= 0 for b in _BLANK)

    def _take(self, buf: bytes) -> bytes:
        """Relay the whole events of `buf` (which starts a line) and hold the rest."""
        if buf.endswith(b"\n\n"):  # vLLM's blocks: whole events, nothing to hold
            self._event = False
            return self._ready(buf)
        end = _events_end(buf)
        rest = buf[end:]
        first = _first_data_line(rest)
        if first >= 0:  # an event under way: held from its first data line
            cut, self._event = end + first, True
        else:  # leading field lines go now; an unfinished line waits
            cut, self._event = end + max(rest.rfind(b"\n"), rest.rfind(b"\r")) + 1, False
        out = self._ready(buf[:cut]) if cut else b""
        if cut < len(buf) and not self.oversized and not (self.dropped and self.stop_at_drop):
            self._held, self._held_len = [buf[cut:]], len(buf) - cut
            if self._held_len > self.max_line_bytes:
                self._oversize()
        return out

    def _ready(self, data: bytes) -> bytes:
        # find() rather than `in`: bytes.__contains__ first tries its argument as an int.
        slow = data.find(_KV_NAME) >= 0 or (data.find(b"\\") >= 0 and data.find(_ESCAPE) >= 0)
        small = len(data) <= self.max_line_bytes  # else some event may be above the limit
        if small and not slow and (not self._ids or data.find(_ID_NAME) < 0):
            return data  # names nothing (an event of several data lines too: as it came)
        if not slow and small and data.find(b"\n") == len(data) - 2 and data.startswith(_DATA_OBJ) and data[-1] == 0x0A:
            # vLLM's block: one compact data line and the empty line that ends its event
            # (no CR: _multi_data's precondition), the path of every streamed token.
            try:
                return self._compact(data) if data.find(b"\r") < 0 else self._ready_lines(data, slow)
            except NotCompact:
                pass
        return self._ready_lines(data, slow)

    def _ready_lines(self, data: bytes, slow: bool) -> bytes:
        small = len(data) <= self.max_line_bytes
        if small and not _multi_data(data):
            out = []
            for x in data.splitlines(keepends=True):
                out.append(self._line(x, slow))
                if self.dropped and self.stop_at_drop:
                    break
            return b"".join(out)
        # Some event has several data lines, or may be above the limit: event by event.
        out, event, size = [], [], 0
        for x in data.splitlines(keepends=True):
            event.append(x)
            # Counted from the event's first data line, as a held event is (the fields before
            # it have gone): the bound then falls alike however the stream was split.
            if size or x.startswith(b"data:"):
                size += len(x)
            if x in _EOLS:
                out.append(self._event_out(event, size, slow))
                event, size = [], 0
                if self.oversized or (self.dropped and self.stop_at_drop):
                    return b"".join(out)
        if event:
            out.append(self._event_out(event, size, slow))
        return b"".join(out)

    def _event_out(self, lines: list[bytes], size: int, slow: bool) -> bytes:
        if size > self.max_line_bytes:
            self._oversize()
            return b""
        if len(lines) > 2 and sum(x.startswith(b"data:") for x in lines) > 1:
            return self._joined(lines, check=False)
        out = []
        for x in lines:
            out.append(self._line(x, slow))
            if self.dropped and self.stop_at_drop:
                break
        return b"".join(out)

    def _joined(self, lines: list[bytes], check: bool) -> bytes:
        """An event whose data is split over several data: lines, which SSE joins with "\\n"
        (valid JSON may break a line wherever whitespace may be). If it names a field it is
        parsed whole and relayed as one compact data line."""
        raw = b"".join(lines)
        names = raw.find(_KV_NAME) >= 0 or raw.find(_ESCAPE) >= 0 or (self._ids and raw.find(_ID_NAME) >= 0)
        if not names and not check:
            return raw
        if names and any(not x.startswith(b"data:") and self._names(x) for x in lines):
            # A field line naming one (as _line drops it when the event is read line by line,
            # which a stream split before its data lines is): the event is dropped alike.
            self._break()
            self.dropped += 1
            return b""
        value = b"\n".join(_data_value(x) for x in lines if x.startswith(b"data:"))
        try:
            chunk = orjson.loads(value)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            if not names and value.strip() == b"[DONE]":
                return raw
            self._break()
            self.dropped += 1
            return b""
        if not self._strip(chunk):
            return raw
        first = next(i for i, x in enumerate(lines) if x.startswith(b"data:"))
        # Ended as the last data line was: with a CR after a line that ended in CR, the LF of
        # the empty line after the last would make a CRLF, and the event would run on.
        last = next(x for x in reversed(lines) if x.startswith(b"data:"))
        one = b"data: " + orjson.dumps(chunk) + (_eol(last) or b"\n")
        return b"".join([*lines[:first], one, *(x for x in lines[first:] if not x.startswith(b"data:"))])

    def _names(self, line: bytes) -> bool:
        """Does a line name a field the router cuts, or hold an escape that may spell one?"""
        return line.find(_KV_NAME) >= 0 or (self._ids and line.find(_ID_NAME) >= 0) or line.find(_ESCAPE) >= 0

    def _oversize(self) -> None:
        self.oversized = True
        self.dropped += 1
        self._break()
        self._held, self._held_len = [], 0

    def flush(self) -> bytes:
        """The stream ended: filter what is held, or drop a data line that is cut short JSON
        (then the turn is incomplete and must not be stored)."""
        tail = b"".join(self._held)
        self._held, self._held_len = [], 0
        if not tail or self.oversized:
            return b""
        lines = tail.splitlines(keepends=True)
        if sum(x.startswith(b"data:") for x in lines) > 1:
            return self._joined(lines, check=True)
        out = []
        for x in lines:
            start = _json_start(x)
            if start >= 0:  # a data line of an event without its empty line: whole JSON, or cut short
                try:
                    orjson.loads(x[start:])
                except orjson.JSONDecodeError:
                    self._break()
                    self.dropped += 1
                    continue
            out.append(self._line(x, True))
        return b"".join(out)

    def line(self, line: bytes) -> bytes:
        """One SSE line (with its line end)."""
        return self._line(line, True)

    def _line(self, line: bytes, slow: bool) -> bytes:
        """slow=False: the block this line came from has neither kv_transfer_params nor an
        escape, so the compact id path is the only one to try."""
        start = _json_start(line)
        if start < 0:
            if line.find(_KV_NAME) >= 0 or (self._ids and line.find(_ID_NAME) >= 0) or line.find(_ESCAPE) >= 0:
                # Not an SSE data line with an object (a JSON answer to a streamed request, a
                # data line holding an array...) yet it may carry what the client must not see.
                self._break()
                self.dropped += 1
                return b""
            return line
        if not slow or (line.find(_KV_NAME) < 0 and (line.find(b"\\") < 0 or line.find(_ESCAPE) < 0)):
            if not self._ids:
                return line
            try:
                return self._compact(line)
            except NotCompact:
                pass
        try:
            return self._parsed(line, start)
        except orjson.JSONDecodeError:
            self._break()
            self.dropped += 1
            return b""

    def _break(self) -> None:
        self.broken = True
        self.captured.kv = None

    def _compact(self, line: bytes) -> bytes:
        """The fast path: every `token_ids` in the line is a compact id member; cut (if asked)
        and capture them as bytes. Raises NotCompact for anything else."""
        i = line.find(_ID_NAME)
        if i < 0:
            return line
        one = _ONE_ID.match(line, i - 2)
        if one is not None and line.find(_ID_NAME, one.end()) < 0:
            # A streamed token's chunk: one output id, the line's only id field.
            if self.capture:
                cap = self.captured
                cap.choices = max(cap.choices, 1)
                if cap.output_ids is not None:
                    cap.output_ids.append(int(one.group(1)))
            return line[: one.start()] + line[one.end() :] if self.strip_ids else line
        prompt: bytes | None = None
        outs: list[list[int]] = []
        pieces: list[bytes] = []
        pos = 0
        while i >= 0:
            if line[i - 1] == 0x22:  # "
                k, is_prompt = i - 1, False
            elif i >= 8 and line[i - 8 : i] == _PROMPT:  # (compiled, a slice from -1 raised SystemError)
                k, is_prompt = i - 8, True
            else:
                raise NotCompact
            j = i + 11  # token_ids":
            if line[k - 1] not in (0x7B, 0x2C) or line[j - 2 : j] != b'":':  # { ,
                raise NotCompact
            if line.startswith(b"null", j):
                end = j + 4
            elif line.startswith(b"[", j):
                end = line.find(b"]", j) + 1
                if end <= 0:
                    raise NotCompact
                raw = line[j:end]
                if is_prompt:  # thousands of ids: kept as decode wrote them (see Captured.prompt)
                    if raw.translate(None, _INT_LIST):
                        raise NotCompact  # not a compact list of ints: parsed, or refused
                    prompt = raw if prompt is None else prompt
                else:
                    try:
                        out = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        raise NotCompact from None
                    if raw.strip(_INT_LIST) and (out := token_ids(out)) is None:
                        raise NotCompact
                    outs.append(out)
            else:
                raise NotCompact
            if self.strip_ids:
                if line[k - 1] == 0x2C:
                    pieces.append(line[pos : k - 1])
                    pos = end
                elif line[end : end + 1] == b",":
                    pieces.append(line[pos:k])
                    pos = end + 1
                else:
                    pieces.append(line[pos:k])
                    pos = end
            i = line.find(_ID_NAME, end)
        self._capture(prompt, outs)
        if not pieces:
            return line
        pieces.append(line[pos:])
        return b"".join(pieces)

    def _capture(self, prompt: bytes | IdText | None, outs: list[list[int]], raw: bool = True) -> None:
        """prompt: a JSON array as decode wrote it (raw), or ids' text (not raw)."""
        if not self.capture:
            return
        cap = self.captured
        if prompt is not None and cap.prompt_raw is None and cap.prompt_ids is None:
            if raw:
                cap.prompt_raw = prompt
            else:
                cap.prompt_ids = IdText(prompt)
        if outs:
            cap.choices = max(cap.choices, len(outs))
            if cap.output_ids is not None:
                cap.output_ids.extend(outs[0])

    def _parsed(self, line: bytes, start: int) -> bytes:
        """Any JSON form: parse, take the fields out, re-encode (compactly) if one was there."""
        chunk = orjson.loads(line[start:])
        if not isinstance(chunk, dict):
            self._break()  # a data line names a field, but is not an object
            self.dropped += 1
            return b""
        if not self._strip(chunk):
            return line
        return line[:start] + orjson.dumps(chunk) + _eol(line)

    def _strip(self, chunk: dict[str, Any]) -> bool:
        """Capture and (as asked) take out the fields of one parsed event; True if any was there."""
        changed = False
        kv = chunk.pop("kv_transfer_params", _MISSING)
        if kv is not _MISSING:
            changed = True
            if kv is not None and not well_formed_kv(kv):
                self._break()  # never stored, never attached to a later turn
            elif kv is not None and not self.broken:
                self.captured.kv = kv
        if self._ids:
            prompt: list[int] | None = None
            outs: list[list[int]] = []
            choices = chunk.get("choices")
            holders = [chunk, *(c for c in choices if isinstance(c, dict))] if isinstance(choices, list) else [chunk]
            for holder in holders:
                for name in ("prompt_token_ids", "token_ids"):
                    value = holder.pop(name, _MISSING) if self.strip_ids else holder.get(name, _MISSING)
                    if value is _MISSING:
                        continue
                    changed = changed or self.strip_ids
                    if value is None:
                        continue
                    ids = token_ids(value)
                    if ids is None:
                        self._break()  # ids the router cannot read: the entry would be wrong
                    elif name == "token_ids":
                        outs.append(ids)
                    elif prompt is None:
                        prompt = ids
            text = None
            if prompt is not None:
                try:
                    text = of_list(prompt)
                except ValueError:
                    self._break()  # a negative id: no token
            self._capture(text, outs, raw=False)
        return changed


def filter_response(data: dict[str, Any], capture: bool, strip_ids: bool) -> Captured:
    """Non-streamed decode answer (already parsed, so any JSON form): capture, then strip
    internals in place."""
    cap = Captured()
    kv = data.pop("kv_transfer_params", None)
    cap.kv = kv if well_formed_kv(kv) else None
    choices = data.get("choices")
    if type(choices) is not list:
        choices = []
        cap.kv = None  # not an answer vLLM gives: nothing to build on
    cap.choices = len(choices)
    prompt = data.get("prompt_token_ids")
    if capture and choices and isinstance(choices[0], dict):
        first = choices[0]
        prompt = prompt if prompt is not None else first.get("prompt_token_ids")
        prompt = token_ids(prompt)
        try:
            cap.prompt_ids = of_list(prompt) if prompt is not None else None
        except ValueError:
            cap.prompt_ids = None  # a negative id: no token
        cap.output_ids = token_ids(first.get("token_ids"))
    if strip_ids:
        data.pop("prompt_token_ids", None)
        for c in choices:
            if isinstance(c, dict):
                c.pop("prompt_token_ids", None)
                c.pop("token_ids", None)
    return cap
