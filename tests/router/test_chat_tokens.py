"""The router's own tokenizer: exact ids from the stored head plus the encoded tail, and trust
earned against the engine before its ids are used."""

from __future__ import annotations

import random
from pathlib import Path

import aiohttp
import pytest

from pdx.local.localmodel import build_local_model
from pdx_router.chat_tokens import ChatTokenizer, TextPrefix
from pdx_router.config import ConfigError
from pdx_router.ids import count, of_list
from pdx_router.testing.fake_engine import Cluster

from .conftest import Stack, StackFactory
from .helpers import LONG, assistant, chat, user


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_local_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def tok(model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer.from_dir(model_dir)


def _conversation(rng: random.Random, turns: int) -> list[list[dict[str, str]]]:
    """Growing chats whose texts include newlines, unicode and a literal special token."""
    pieces = ["tool output:\n", "ok ", "naïve café ", "<|im_end|> inside text ", "  spaces ", "数字 ", "x=1;\n"]
    msgs: list[dict[str, str]] = [{"role": "system", "content": "You are an agent."}]
    out = []
    for _ in range(turns):
        msgs.append(user("".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))))
        out.append(list(msgs))
        msgs.append(assistant("".join(rng.choice(pieces) for _ in range(rng.randint(1, 10)))))
    return out


def test_resumed_ids_equal_a_whole_encode_on_growing_chats(tok: ChatTokenizer) -> None:
    rng = random.Random(7)
    resumed = 0
    for _ in range(30):
        prefix: TextPrefix | None = None
        held = of_list([])
        for msgs in _conversation(rng, 6):
            text = tok.render({"messages": msgs})
            assert text is not None
            whole = tok.encode(text)
            assert tok.encode_in_thread(text) == whole
            ids = tok.resume(text, prefix, held, count(held))
            if ids is not None:
                assert ids == of_list(whole)
                resumed += 1
            prefix, held = tok.prefix_of(text, of_list(whole)), of_list(whole)
            assert prefix is not None and 0 < prefix.tokens < len(whole)
    assert resumed == 30 * 5  # every turn after the first resumed


def test_an_edited_head_is_not_resumed(tok: ChatTokenizer) -> None:
    first = [user(LONG)]
    text = tok.render({"messages": first})
    assert text is not None
    ids = of_list(tok.encode(text))
    prefix = tok.prefix_of(text, ids)
    edited = [user(LONG.replace("word7 ", "word7x ")), assistant("a"), user("b")]
    edited_text = tok.render({"messages": edited})
    assert edited_text is not None
    assert tok.resume(edited_text, prefix, ids, count(ids)) is None


def test_renders_like_transformers_apply_chat_template(tok: ChatTokenizer, model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    for msgs in _conversation(random.Random(3), 4):
        for gen in (True, False):
            ours = tok.render({"messages": msgs, "add_generation_prompt": gen})
            assert ours == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert ours is not None and tok.encode(ours) == hf.encode(ours, add_special_tokens=False)


def test_requests_it_cannot_render_like_the_engine_are_left_to_it(tok: ChatTokenizer) -> None:
    msgs = [user("hi")]
    assert tok.render({"messages": msgs}) is not None
    assert tok.render({"messages": msgs, "tools": [{"type": "function"}]}) is None
    assert tok.render({"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}) is None
    assert tok.render({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}) is None
    assert tok.render({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}) is None


def test_a_directory_without_a_tokenizer_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^tokenizer: .*leave it unset"):
        ChatTokenizer.from_dir(tmp_path)


async def _converse(s: Stack, http: aiohttp.ClientSession, turns: int) -> list[str]:
    msgs = [user(LONG)]
    outcomes = []
    for i in range(turns):
        status, headers, data = await chat(http, s.url, msgs, conversation="t1")
        assert status == 200
        outcomes.append(headers["X-PDX-Reuse"])
        msgs += [assistant(data["choices"][0]["message"]["content"]), user(f"question {i} <|im_end|> ok")]
    return outcomes


async def test_once_trusted_reused_turns_need_no_tokenize_call(
    make_stack: StackFactory, http: aiohttp.ClientSession, tok: ChatTokenizer, model_dir: Path
) -> None:
    s = await make_stack(cluster=Cluster(chat_tokens=tok), tokenizer=str(model_dir))
    outcomes = await _converse(s, http, 12)
    assert outcomes == ["miss"] + ["hit"] * 11
    tokenize_calls = sum(path == "/tokenize" for path, _ in s.prefill.requests)
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["routerTokenizer"] == "trusted" and stats["tokenizeMismatch"] == 0
    assert stats["promptIds"] == {"local": 4, "engine": 7}
    # Turns 1-8 are probation (whole prompts checked); 2-8 still asked the engine.
    assert tokenize_calls == 7
    assert s.cluster.reads and all(r.correct for r in s.cluster.reads)
    metrics = await (await http.get(s.url + "/metrics")).text()
    assert 'pdx_router_prompt_ids_total{source="local"} 4.0' in metrics


async def test_a_tokenizer_that_renders_unlike_the_engine_is_never_used(
    make_stack: StackFactory, http: aiohttp.ClientSession, tok: ChatTokenizer, model_dir: Path
) -> None:
    # The engine's template puts a blank line after each message; the router's does not.
    engine_tok = ChatTokenizer(tok.tokenizer, tok.template_source.replace("'\\n' }}", "'\\n\\n' }}"), tok.specials)
    assert engine_tok.render({"messages": [user("a")]}) != tok.render({"messages": [user("a")]})
    s = await make_stack(cluster=Cluster(chat_tokens=engine_tok), tokenizer=str(model_dir))
    outcomes = await _converse(s, http, 4)
    assert outcomes == ["miss", "hit", "hit", "hit"]  # reuse goes on, on the engine's ids
    stats = await (await http.get(s.url + "/v1/pdx/stats")).json()
    assert stats["routerTokenizer"] == "disabled"
    assert sum(path == "/tokenize" for path, _ in s.prefill.requests) == 3
    assert all(r.correct for r in s.cluster.reads)


def test_a_count_in_pieces_is_the_number_of_ids_give_or_take_one_a_cut(tok: ChatTokenizer) -> None:
    rng = random.Random(7)
    words = ["tool", "output:", '{"k": [1, 2]}', "naïve", "数字", "  ", "\n", "x=1;", "<|im_end|>", "12345"]
    for n in (1, 50, 800, 3000):
        text = " ".join(rng.choice(words) for _ in range(n))
        cuts = len(text) // 2048
        assert abs(tok.count(text) - len(tok.encode(text))) <= cuts
    assert tok.count("") == 0
