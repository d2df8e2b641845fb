"""The assistant message decode answered, as a client will send it back: what names the
stored turn when the conversation is found by its history (policy/history.py).

Only turns kept by history read it, from the filtered stream (whole events). A block of
vLLM's compact events that carry only text (no backslash, so every quote is a JSON quote and
`"delta":{"content":"` can only be that key) gives its text by byte search: parsing each
event cost ~6 µs, a third of the router's extra CPU per turn found by its history. Any other
event that may carry text or tool calls is parsed.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from .policy import history

_WORTH: Final = (b'"content"', b"tool_calls", b"\\")  # a line without these adds nothing
_TEXT: Final = b'"delta":{"content":"'
_ANY_TEXT: Final = b'"content"'


class StreamedAnswer:
    """The first choice's text and tool calls, pieced together from the deltas of a stream."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.broken = False  # a data line that could not be read: the answer is unknown

    def feed(self, block: bytes) -> None:
        if block.find(b"\\") < 0 and block.find(b"tool_calls") < 0:
            n = block.count(_TEXT)
            if n == block.count(_ANY_TEXT):  # every text in the block is a delta's first key
                i = block.find(_TEXT)
                while i >= 0:
                    i += len(_TEXT)
                    end = block.find(b'"', i)
                    try:
                        self._text.append(block[i:end].decode())
                    except UnicodeDecodeError:
                        self.broken = True  # not JSON text: the answer is unknown
                    i = block.find(_TEXT, end)
                return
        for line in block.splitlines():
            if not line.startswith(b"data:") or not any(w in line for w in _WORTH):
                continue
            try:
                event = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                self.broken = True
                continue
            choices = event.get("choices") if isinstance(event, dict) else None
            for choice in choices if isinstance(choices, list) else ():
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
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
        if self.broken:
            return None
        calls = [self._calls[i] for i in sorted(self._calls)]
        return history.answer_message("".join(self._text) if self._text else None, calls or None)


def of_json(data: dict[str, Any]) -> dict[str, Any] | None:
    """A non-streamed answer's first choice's message."""
    choices = data.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0 and isinstance(choice.get("message"), dict):
            message: dict[str, Any] = choice["message"]
            return message
    return None
