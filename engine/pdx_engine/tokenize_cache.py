"""vLLM general plugin: a conversation's prompt is tokenized once, not again every turn.

An agent resends its whole history each turn, and each engine that serves the turn renders it
and tokenizes all of it again in its API server: on an H200 the decode that held a 24.7k-token
history spent ~80 ms before scheduling a turn whose own compute took ~40 ms, and that work grew
with the history while the compute did not (docs/results/h200-2026-12-03b).

A fast tokenizer splits its input at added special tokens before anything else, so the ids of
``text[:b] + text[b:]`` are the ids of each part, concatenated, when ``b`` is where such a token
starts (``<|im_start|>`` in a chat template). This plugin keeps, per prompt, the ids up to the
last such boundary under a digest of the text before it; a later prompt that starts with that
text (the same conversation, one turn on) tokenizes only what follows. Each boundary's digest
chains the previous one, so a lookup costs one pass of hashing over the text, no tokenization.
The chain starts from the request's ``cache_salt`` (the router's per-tenant salt), so a tenant
never finds another's text here: a faster tokenization would tell it that text was sent.

``PDX_TOKENIZE_CACHE_BYTES`` (the operator renders it; unset or 0: off) bounds the ids kept, least
recently used first. A prompt the cache cannot serve exactly (offsets asked for, truncation
reached, a tokenizer that adds its own special tokens) is tokenized as vLLM does it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from pdx_contract.kv_prefix import salt_seed
from pdx_engine.import_hook import module_exists, on_import

logger = logging.getLogger("vllm.pdx_plugin")

ENV = "PDX_TOKENIZE_CACHE_BYTES"
MODULE = "vllm.renderers.base"
MIN_CHARS = 1024  # below this a prompt is tokenized whole: the lookup would cost what it saves
_MARK = "_pdx_tokenize_cache"

Encode = Callable[[str], Sequence[int]]


def boundary_pattern(added: Mapping[int, Any]) -> re.Pattern[str] | None:
    """The special tokens a text may be cut before, from a tokenizer's ``added_tokens_decoder``.

    Only tokens matched on the raw text (not normalized), not eating the blanks before them
    (lstrip) and not bound to word edges qualify: at the start of one of those, the tokenizer
    itself cuts. Longest first, as the tokenizer matches them (leftmost-longest).
    """
    contents = sorted(
        {
            str(t.content)
            for t in added.values()
            if getattr(t, "special", False)
            and not getattr(t, "normalized", True)
            and not getattr(t, "lstrip", True)
            and not getattr(t, "single_word", True)
            and str(getattr(t, "content", ""))
        },
        key=lambda c: (-len(c), c),
    )
    return re.compile("|".join(map(re.escape, contents))) if contents else None


class PrefixTokens:
    """Ids of prompts' leading parts, by the digest of their text; thread-safe, bounded in bytes."""

    def __init__(self, pattern: re.Pattern[str], max_bytes: int) -> None:
        self._pattern = pattern
        self._max_bytes = max_bytes
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.tokens_skipped = 0
        self.said = False  # whether the engine's log has the first hit

    def encode(self, text: str, encode: Encode, salt: str | None = None) -> list[int]:
        """``encode(text)``'s ids, tokenizing only what follows the longest leading part known
        under the same ``salt`` (the request's cache_salt)."""
        cuts = [m.start() for m in self._pattern.finditer(text) if m.start() > 0]
        if not cuts:
            return list(encode(text))
        digests = _chain(text, cuts, salt)
        with self._lock:
            at = next((i for i in reversed(range(len(cuts))) if digests[i] in self._entries), None)
            found = None if at is None else (at, self._entries.pop(digests[at]))
            if found is not None:
                self._bytes -= found[1].itemsize * len(found[1])
        start, ids = (0, array("i")) if found is None else (cuts[found[0]], found[1])
        reused = len(ids)
        last = cuts[-1]
        if start < last:
            ids.extend(encode(text[start:last]))
        held = len(ids)
        ids.extend(encode(text[last:]))
        self._keep(digests[-1], ids[:held])
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
            self.tokens_skipped += reused
        return ids.tolist()

    def _keep(self, digest: bytes, ids: array[int]) -> None:
        size = ids.itemsize * len(ids)
        if size > self._max_bytes:
            return
        with self._lock:
            old = self._entries.pop(digest, None)
            if old is not None:
                self._bytes -= old.itemsize * len(old)
            self._entries[digest] = ids
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.itemsize * len(evicted)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


def _chain(text: str, cuts: list[int], salt: str | None = None) -> list[bytes]:
    """One digest per cut, of all the text before it (after the salt): each chains the one before."""
    digests: list[bytes] = []
    digest = salt_seed(salt)
    start = 0
    for cut in cuts:
        digest = hashlib.blake2b(digest + text[start:cut].encode("utf-8", "surrogatepass"), digest_size=16).digest()
        digests.append(digest)
        start = cut
    return digests


# -- vLLM wiring -------------------------------------------------------------------------------


def max_bytes_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """The bound in bytes; 0 (off) when unset. A bad value fails the engine's start, naming the fix."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise ValueError(f"{ENV}={raw!r}: expected a whole number of bytes (0 turns the cache off), or unset it")
    return int(raw)


def _adds_nothing(tokenizer: Any) -> bool:
    """Whether ``add_special_tokens=True`` adds no ids (Qwen's: no BOS), so such calls can be cut too."""
    return list(tokenizer("a", add_special_tokens=True)["input_ids"]) == list(
        tokenizer("a", add_special_tokens=False)["input_ids"]
    )


@functools.lru_cache(maxsize=8)
def _cache_for(tokenizer: Any, max_bytes: int) -> tuple[PrefixTokens, bool] | None:
    """One cache per tokenizer object, and whether its add_special_tokens=True calls qualify."""
    added = getattr(tokenizer, "added_tokens_decoder", None)
    pattern = boundary_pattern(added) if isinstance(added, Mapping) else None
    if pattern is None:
        logger.warning("pdx plugin: %s has no special tokens to cut at; prompts are tokenized whole", type(tokenizer))
        return None
    return PrefixTokens(pattern, max_bytes), _adds_nothing(tokenizer)


def wrap_tokenize(original: Callable[..., Any], max_bytes: int) -> Callable[..., Any]:
    """``BaseRenderer._tokenize_prompt``, served from the cache where that is exact."""

    @functools.wraps(original)
    def _tokenize_prompt(self: Any, prompt: Any, params: Any) -> Any:
        text = prompt.get("prompt")
        if not isinstance(text, str) or len(text) < MIN_CHARS or self._wants_offsets(prompt, params):
            return original(self, prompt, params)
        tokenizer = self.get_tokenizer()
        found = _cache_for(tokenizer, max_bytes)
        kwargs = params.get_encode_kwargs()
        if found is None or (kwargs.get("add_special_tokens", True) and not found[1]):
            return original(self, prompt, params)
        cache = found[0]
        salt = prompt.get("cache_salt")
        ids = cache.encode(
            text,
            lambda part: tokenizer(part, add_special_tokens=False)["input_ids"],
            salt if isinstance(salt, str) else None,
        )
        if cache.hits and not cache.said:
            cache.said = True
            logger.info("pdx plugin: a prompt's first %d of %d ids came from the tokenize cache",
                        cache.tokens_skipped, len(ids))
        limit = kwargs.get("max_length")
        if kwargs.get("truncation") and limit is not None and len(ids) > limit:
            return original(self, prompt, params)  # too long: vLLM cuts or refuses it as it would
        return self._build_tokens_prompt(ids, prompt)

    setattr(_tokenize_prompt, _MARK, max_bytes)
    return _tokenize_prompt


def patch_module(module: ModuleType, max_bytes: int) -> bool:
    """Install the cache on ``vllm.renderers.base.BaseRenderer``; False if already there."""
    renderer = module.BaseRenderer
    current = renderer._tokenize_prompt
    if getattr(current, _MARK, None) is not None:
        return False
    renderer._tokenize_prompt = wrap_tokenize(current, max_bytes)
    logger.info("pdx plugin: prompts' leading parts keep their ids (up to %d MiB)", max_bytes >> 20)
    return True


def register() -> None:
    """Entry point (``vllm.general_plugins``); a no-op unless the variable is set above 0."""
    max_bytes = max_bytes_from_env()
    if max_bytes == 0:
        return
    if not module_exists(MODULE):
        logger.error("pdx plugin: this vLLM has no %s; prompts are tokenized whole every turn", MODULE)
        return
    on_import(MODULE, functools.partial(patch_module, max_bytes=max_bytes))
