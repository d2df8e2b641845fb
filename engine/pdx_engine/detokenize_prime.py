"""vLLM general plugin: a request's first token is detokenized without decoding its whole prompt.

vLLM 0.32's ``FastIncrementalDetokenizer`` primes tokenizers' ``DecodeStream`` with every prompt
id, so the stream's first ``step`` decodes the whole prompt (twice). That runs in the API
server's output handler after the engine has its first token and before any answer leaves: on
both hops of every turn, outside the engine's TTFT, so in what `pdx bench` reports as "API and
HTTP". On this project's 2-core machine it took 1.2-1.3 ms a hop at 2k prompt tokens and 8-16
ms at 24k, and 0.2 ms or less with this plugin (docs/engine-notes.md, issue 43).

A ``DecodeStream`` depends on its primed ids only through its first emitted text,
``decode(primed + new)[len(decode(primed)):]``; from then on it holds only the new ids. Under a
ByteLevel decoder (Qwen, Llama 3, GPT-style) decoding is the UTF-8 reading of the tokens' bytes
put end to end, so that text is the same for the whole prompt and for any suffix of it whose
own decoding is non-empty and has no replacement character (the suffix then ends where the
prompt's last character ends). This plugin primes the stream with the shortest such suffix of
at least ``MIN_IDS`` ids (vLLM primed with such a suffix before it primed with the whole
prompt). Other decoders, short prompts, and prompts without such a suffix within ``MAX_IDS``
ids keep vLLM's priming. ``PDX_DETOKENIZE_PRIME=0`` (a role's env) keeps it everywhere.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from pdx_engine.import_hook import module_exists, on_import
from pdx_engine.plugin_env import switch

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_DETOKENIZE_PRIME"
MODULE = "vllm.v1.engine.detokenizer"
MIN_IDS = 8  # context kept before the first new token (a char needs at most 4 byte tokens)
MAX_IDS = 64  # no clean suffix this long: keep vLLM's priming
_MARK = "_pdx_detokenize_prime"
_REPLACEMENT = "\ufffd"


def byte_level(tokenizer: Any) -> bool:
    """Whether a ``tokenizers.Tokenizer`` decodes with a plain ByteLevel decoder."""
    return type(getattr(tokenizer, "decoder", None)).__name__ == "ByteLevel"


def prompt_suffix(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool) -> list[int] | None:
    """The shortest suffix of ``ids`` (``MIN_IDS`` to ``MAX_IDS`` long) whose decoding is
    non-empty and whole characters only; None if the prompt is short or has none."""
    if len(ids) <= MAX_IDS:
        return None
    for n in range(MIN_IDS, MAX_IDS + 1):
        suffix = list(ids[-n:])
        text = tokenizer.decode(suffix, skip_special_tokens=skip_special_tokens)
        if text and _REPLACEMENT not in text:
            return suffix
    return None


def reprime(detokenizer: Any, request: Any, stream_type: Callable[..., Any]) -> bool:
    """Replace a constructed detokenizer's stream by one primed with a short prompt suffix;
    True if replaced."""
    tokenizer = getattr(detokenizer, "tokenizer", None)
    ids = getattr(request, "prompt_token_ids", None)
    if ids is None or not hasattr(detokenizer, "stream") or not byte_level(tokenizer):
        return False
    skip = bool(detokenizer.skip_special_tokens)
    suffix = prompt_suffix(tokenizer, ids, skip)
    if suffix is None:
        return False
    try:
        stream = stream_type(ids=suffix, skip_special_tokens=skip)
    except TypeError:  # a tokenizers release whose DecodeStream takes no primed ids
        return False
    detokenizer.stream = stream
    return True


def wrap_init(original: Callable[..., None], module: ModuleType) -> Callable[..., None]:
    """``FastIncrementalDetokenizer.__init__``, then the stream re-primed (see ``reprime``)."""

    said = False

    @functools.wraps(original)
    def __init__(self: Any, tokenizer: Any, request: Any) -> None:
        nonlocal said
        original(self, tokenizer, request)
        # The stream type as vLLM looks it up (a backend may patch it on the module).
        if reprime(self, request, module.tokenizers.decoders.DecodeStream) and not said:
            # Also said here: the API server may import the detokenizer (and so patch it)
            # before vLLM has set up its log handlers, and the line at patch time is lost.
            said = True
            logger.info(
                "pdx plugin: a first token was detokenized against the prompt's last ids, not all %d",
                len(request.prompt_token_ids),
            )

    setattr(__init__, _MARK, True)
    return __init__


def patch_module(module: ModuleType) -> bool:
    """Wrap ``FastIncrementalDetokenizer.__init__``; True if patched now."""
    cls = getattr(module, "FastIncrementalDetokenizer", None)
    if cls is None or not hasattr(module, "tokenizers"):
        logger.error("pdx plugin: %s has no FastIncrementalDetokenizer; first tokens decode the whole prompt", MODULE)
        return False
    if getattr(cls.__init__, _MARK, False):
        return False
    cls.__init__ = wrap_init(cls.__init__, module)
    logger.info("pdx plugin: first tokens are detokenized against the prompt's last %d+ ids", MIN_IDS)
    return True


def enabled_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """On unless ``PDX_DETOKENIZE_PRIME`` is 0; another value fails the engine's start, naming the fix."""
    return switch(ENV, True, "1 (on, the default) or 0 (vLLM's priming)", environ)


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; safe to call repeatedly."""
    if not enabled_from_env():
        return
    if not module_exists(MODULE):
        logger.error("pdx plugin: this vLLM has no %s; first tokens decode the whole prompt", MODULE)
        return
    on_import(MODULE, patch_module)
