"""The model's own tokenizer in the router: a reused turn's prompt ids without a /tokenize hop.

A conversation's prompt grows at its end. The stored entry already holds decode's ids for
the previous prompt, so only the new tail needs encoding. The tail starts at a special token
(`<|im_start|>` in ChatML): tokenizers split added tokens out before anything else, so the
ids of `head + tail` are the ids of `head` followed by those of `tail`. The head is recognised
by a digest of its rendered text; if the template re-rendered it differently (a stripped
reasoning block, an edited message), the digest differs and the engine tokenizes instead.

The router renders the chat template itself, so its ids can only be trusted once they have
agreed with the engine's: see `policy.trust`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from . import ids
from .config import ConfigError
from .ids import IdText

# Chat request fields that change how vLLM renders the prompt (or may: tool_choice decides
# whether tools are rendered under --exclude-tools-when-tool-choice-none).
_RENDER_ARGS = (
    "tools",
    "tool_choice",
    "chat_template",
    "chat_template_kwargs",
    "continue_final_message",
    "documents",
    "reasoning_effort",
    "mm_processor_kwargs",
    "add_special_tokens",
)


def renders_plainly(body: dict[str, Any]) -> bool:
    """A chat of plain text messages with no rendering arguments: every renderer (vLLM's chat
    endpoint, its /tokenize, this module) turns it into the same prompt."""
    messages = body.get("messages")
    if not isinstance(messages, list) or any(k in body for k in _RENDER_ARGS):
        return False
    return all(
        isinstance(m, dict) and not set(m) - {"role", "content"} and isinstance(m.get("content"), str) for m in messages
    )


@dataclass(frozen=True)
class TextPrefix:
    """Where the next turn may resume: the first `chars` characters of this prompt's rendered
    text (digest `digest`) are exactly its first `tokens` ids."""

    chars: int
    digest: str
    tokens: int

    def to_json(self) -> list[Any]:
        return [self.chars, self.digest, self.tokens]

    @classmethod
    def from_json(cls, raw: Any) -> TextPrefix | None:
        if isinstance(raw, list) and len(raw) == 3:
            return cls(int(raw[0]), str(raw[1]), int(raw[2]))
        return None


def _digest(text: str) -> str:
    """128 bits of SHA-256: ~2x faster than blake2b here (SHA extensions), over a prompt's
    whole head twice a turn. (Entries stored with the blake2b digests of before do not match:
    their next turn asks /tokenize once, as for any head that does not match.)"""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """Templates' tojson, with the defaults Hugging Face gives it (not jinja's HTML-safe one)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


COUNT_PIECE = 2048  # characters of a piece `ChatTokenizer.count` encodes


class ChatTokenizer:
    """tokenizer.json + the chat template of tokenizer_config.json, rendered as Hugging Face
    renders it (the same sandbox, options and variables)."""

    def __init__(self, tokenizer: Tokenizer, template: str, specials: dict[str, str | None]) -> None:
        self.tokenizer = tokenizer
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template_source = template
        self.template = env.from_string(template)
        self.specials = specials
        # Tail starts: special tokens the template writes, split out exactly as written.
        added = tokenizer.get_added_tokens_decoder().values()
        self.boundaries = tuple(
            t.content
            for t in added
            if t.special and not (t.lstrip or t.rstrip or t.normalized) and t.content in template
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ChatTokenizer:
        """Load from a model directory; errors name the file and the fix."""
        root = Path(path)
        try:
            tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
            config = json.loads((root / "tokenizer_config.json").read_text())
        except Exception as exc:  # tokenizers raises its own exception type
            raise ConfigError(
                f"tokenizer: cannot load {root}/tokenizer.json and tokenizer_config.json ({exc}); "
                "point it at the model directory the engines serve, or leave it unset"
            ) from exc
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one renders chats
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise ConfigError(f"tokenizer: {root}/tokenizer_config.json has no chat_template; leave tokenizer unset")
        specials = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        try:
            return cls(tokenizer, template, specials)
        except TemplateError as exc:
            raise ConfigError(
                f"tokenizer: the chat template in {root} does not compile here ({exc}); leave tokenizer unset"
            ) from exc

    def render(self, body: dict[str, Any]) -> str | None:
        """The prompt text of a chat request, or None when the engine must render it
        (rendering arguments, non-text content, fields beyond role and content)."""
        if not renders_plainly(body):
            return None
        try:
            return self.template.render(
                messages=body["messages"],
                add_generation_prompt=body.get("add_generation_prompt", True),
                tools=None,
                documents=None,
                **self.specials,
            )
        except TemplateError:
            return None

    def encode(self, text: str) -> list[int]:
        """The ids alone: the batch call without offsets takes half the CPU of `encode`
        (0.22 against 0.43 ms for a 310-token tail here), and the ids are the same."""
        return list(self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)

    def count(self, text: str) -> int:
        """How many tokens `text` takes, give or take one where it is cut: pieces of about
        COUNT_PIECE characters, each ending before a space, encoded as one batch (the library
        spreads a batch over its threads, and one long text costs more per token than short
        ones: a 16k-token tool output took 45 ms whole and 10 ms in pieces on 2 cores)."""
        pieces, start = [], 0
        while start < len(text):
            end = text.find(" ", start + COUNT_PIECE)
            end = len(text) if end < 0 else end
            pieces.append(text[start:end])
            start = end
        return sum(len(e.ids) for e in self.tokenizer.encode_batch_fast(pieces, add_special_tokens=False))

    def encode_in_thread(self, text: str) -> list[int]:
        """The same ids; for a worker thread (the batch call releases the GIL: at ~1 µs a
        token a 24k-token prompt would otherwise stall every stream for ~25 ms)."""
        return self.encode(text)

    def prefix_of(self, text: str, prompt: IdText) -> TextPrefix | None:
        """Cut this prompt at its last special token: the head for the next turn to resume."""
        cut = max((text.rfind(b) for b in self.boundaries), default=-1)
        if cut <= 0:
            return None
        tail = ids.of_list(self.encode(text[cut:]))
        if not ids.ends_with(prompt, tail):
            return None
        return TextPrefix(cut, _digest(text[:cut]), ids.count(prompt) - ids.count(tail))

    def resume(self, text: str, prefix: TextPrefix | None, held: IdText, held_n: int) -> IdText | None:
        """This prompt's ids from the held head (of held_n ids) plus the encoded tail, or
        None if the head is not this prompt's."""
        if prefix is None or len(text) < prefix.chars or held_n < prefix.tokens:
            return None
        if _digest(text[: prefix.chars]) != prefix.digest:
            return None
        head = ids.head(held, prefix.tokens, held_n)
        return ids.join(head, ids.of_list(self.encode(text[prefix.chars :])))


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None
