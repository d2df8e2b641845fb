"""The assistant message decode answered, as a client will send it back: what names the
stored turn when the conversation is found by its history (policy/history.py); for
`/v1/completions`, the text (policy/prompt_history.py).

Only turns kept by history read it, from the filtered stream (whole events). The relay's
callback only keeps each block (a list append); they are read together at the end, or every
64 kB, so a long answer holds no more than that. Read together, a run of vLLM's compact text
events (no backslash, so every quote is a JSON quote and the pattern below can only be the
delta's content) gives its text in one regular-expression pass; any other run is read event
by event. Parsing each event in the callback cost ~6 µs, the byte search ~1.5 µs.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from .policy import history

_WORTH: Final = (b'"content"', b"tool_calls", b"\\")  # a line without these adds nothing
_ANY_TEXT: Final = b'"content"'
# A delta's text in vLLM's compact form (its first chunk names the role first).
_TEXT: Final = re.compile(rb'"delta":\{(?:"role":"[a-z]+",)?"content":"([^"]*)"')
_BATCH: Final = 64 << 10  # the most of an answer held before it is read
# A completion's text in vLLM's compact form.
_COMPLETION_TEXT: Final = re.compile(rb'"choices":\[\{"index":0,"text":"([^"]*)"')
_ANY_COMPLETION_TEXT: Final = b'"text"'
_COMPLETION_WORTH: Final = (_ANY_COMPLETION_TEXT, b"\\")


class Pieced:
    """An answer pieced together from a stream: the blocks are kept, and read in batches."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._held: list[bytes] = []
        self._held_bytes = 0
        self.broken = False  # a data line that could not be read: the answer is unknown

    def feed(self, block: bytes) -> None:
        """Called for every block of the stream: it only keeps it."""
        self._held.append(block)
        self._held_bytes += len(block)
        if self._held_bytes >= _BATCH:
            self._read()

    def _take(self) -> bytes:
        data = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        return data

    def _compact(self, data: bytes, text: re.Pattern[bytes], marker: bytes) -> bool:
        """Read a run of compact text events in one pass, if it is one: no backslash (every
        quote is a JSON quote) and every `marker` a text's."""
        if data.find(b"\\") >= 0:
            return False
        pieces = text.findall(data)
        if len(pieces) != data.count(marker):
            return False
        try:
            self._text.append(b"".join(pieces).decode())
        except UnicodeDecodeError:
            self.broken = True  # not JSON text: the answer is unknown
        return True

    def _first_choices(self, data: bytes, worth: tuple[bytes, ...]) -> list[dict[str, Any]]:
        """The first choice of each data line that names one of `worth`, parsed."""
        out: list[dict[str, Any]] = []
        for line in data.splitlines():
            if not line.startswith(b"data:") or not any(w in line for w in worth):
                continue
            try:
                event = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                self.broken = True
                continue
            choices = event.get("choices") if isinstance(event, dict) else None
            for choice in choices if isinstance(choices, list) else ():
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    out.append(choice)
        return out

    def _read(self) -> None:
        raise NotImplementedError

    def message(self) -> dict[str, Any] | None:
        raise NotImplementedError


class StreamedAnswer(Pieced):
    """The first choice's text and tool calls, pieced together from the deltas of a stream."""

    def __init__(self) -> None:
        super().__init__()
        self._calls: dict[int, dict[str, Any]] = {}

    def _read(self) -> None:
        data = self._take()
        if data.find(b"tool_calls") < 0 and self._compact(data, _TEXT, _ANY_TEXT):
            return
        for choice in self._first_choices(data, _WORTH):
            self._delta(choice.get("delta"))

    def _delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        if isinstance(text := delta.get("content"), str):
            self._text.append(text)
        for call in delta.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            into = self._calls.setdefault(index if isinstance(index, int) else 0, {"function": {}})
            if call.get("id"):
                into["id"] = call["id"]
            if call.get("type"):
                into["type"] = call["type"]
            fn = call.get("function")
            if isinstance(fn, dict):
                for name in ("name", "arguments"):
                    if isinstance(piece := fn.get(name), str):
                        into["function"][name] = into["function"].get(name, "") + piece

    def message(self) -> dict[str, Any] | None:
        """The assistant message, or None if a line could not be read."""
        if self._held:
            self._read()
        if self.broken:
            return None
        calls = [self._calls[i] for i in sorted(self._calls)]
        return history.answer_message("".join(self._text) if self._text else None, calls or None)


class StreamedText(Pieced):
    """A streamed completion's first choice's text (`/v1/completions`)."""

    def _read(self) -> None:
        data = self._take()
        if self._compact(data, _COMPLETION_TEXT, _ANY_COMPLETION_TEXT):
            return
        for choice in self._first_choices(data, _COMPLETION_WORTH):
            if isinstance(text := choice.get("text"), str):
                self._text.append(text)

    def message(self) -> dict[str, Any] | None:
        """{"text": the text}, or None if a line could not be read."""
        if self._held:
            self._read()
        return None if self.broken else {"text": "".join(self._text)}


def text_of_json(data: dict[str, Any]) -> dict[str, Any] | None:
    """A non-streamed completion's first choice's text, as {"text": ...}."""
    choices = data.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0 and isinstance(choice.get("text"), str):
            return {"text": choice["text"]}
    return None


def of_json(data: dict[str, Any]) -> dict[str, Any] | None:
    """A non-streamed answer's first choice's message."""
    choices = data.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0 and isinstance(choice.get("message"), dict):
            message: dict[str, Any] = choice["message"]
            return message
    return None
