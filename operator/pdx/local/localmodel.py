"""A small model directory that vLLM can serve with ``--load-format dummy``, made offline.

The local runtime and the end-to-end tests need a real architecture (so vLLM runs its real
attention and KV-cache code) but no weights and no hub access. This module writes a Qwen3
``config.json``, a byte-level BPE tokenizer trained here on generated text, a ChatML chat
template and a generation config. Everything is derived from constants in this file, so the
output is deterministic; the directory name carries a hash of those inputs and an existing
directory is reused as is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

Size = Literal["tiny", "small"]

# Bump when the output changes in a way the inputs below do not capture.
_BUILDER_VERSION = 1
_VOCAB_SIZE = 8192
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CORPUS_SEED = 20240607
_CORPUS_SENTENCES = 40_000
_WEIGHTS_SEED = 1234
_WEIGHT_STD = 0.05
_EMBED_STD = 0.1

# ChatML, the format of the Qwen family; add_generation_prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SHAPES: dict[str, dict[str, int]] = {
    # ~6M parameters: start-up and prefill dominated by framework overhead.
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
    # ~90M parameters: prefill compute grows enough for KV reuse to show in TTFT.
    "small": {
        "hidden_size": 1024,
        "intermediate_size": 2560,
        "num_hidden_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 64,
    },
}


def model_config(size: Size) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of a Qwen3ForCausalLM of the given size."""
    if size not in _SHAPES:
        raise ValueError(f"unknown model size {size!r}; expected one of {sorted(_SHAPES)}")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **_SHAPES[size],
        "vocab_size": _VOCAB_SIZE,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": _SHAPES[size]["num_hidden_layers"],
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": _SPECIAL_TOKENS.index("<|endoftext|>"),
        "eos_token_id": _SPECIAL_TOKENS.index("<|im_end|>"),
        "pad_token_id": _SPECIAL_TOKENS.index("<|endoftext|>"),
    }


def _corpus() -> Iterator[str]:
    """Deterministic English-like text with code, numbers and made-up words.

    Made-up words (random syllables) give BPE enough distinct pairs to fill the vocabulary;
    the fixed seed keeps the merges, and so every token id, identical on every machine.
    """
    rng = random.Random(_CORPUS_SEED)
    common = [
        "the", "a", "an", "of", "to", "in", "and", "is", "it", "that", "for", "on", "with",
        "as", "was", "by", "at", "this", "from", "be", "or", "are", "agent", "tool", "call",
        "result", "file", "error", "run", "test", "user", "assistant", "system", "function",
        "value", "return", "list", "read", "write", "open", "close", "request", "response",
        "token", "model", "cache", "block", "prefill", "decode", "turn", "prompt", "reply",
        "search", "query", "code", "line", "print", "import", "class", "def", "if", "else"
    ]
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "z", "br", "ch", "cl", "dr", "gr", "pl", "sh", "st", "str", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "rk", "st", "x"]
    invented = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 3)))
        for _ in range(6000)
    ]
    punct = [".", ".", ".", "?", "!", ":", ";"]
    for i in range(_CORPUS_SENTENCES):
        kind = i % 5
        if kind == 3:
            name = rng.choice(invented)
            arg = rng.choice(invented)
            yield (f"def {name}_{arg}({arg}: int) -> int:\n"
                   f"    return {arg} * {rng.randint(0, 9999)} + len(\"{rng.choice(common)}\")\n")
            continue
        if kind == 4:
            yield (f"{{\"{rng.choice(common)}\": {rng.randint(-5000, 5000)}, "
                   f"\"{rng.choice(invented)}\": \"{rng.choice(invented)}\"}}\n")
            continue
        words = [rng.choice(common) if rng.random() < 0.55 else rng.choice(invented)
                 for _ in range(rng.randint(5, 18))]
        words[0] = words[0].capitalize()
        yield " ".join(words) + rng.choice(punct) + ("\n" if rng.random() < 0.3 else " ")


def _inputs_digest(size: Size, weights: bool) -> str:
    """Hash of everything that determines the output (without generating the corpus)."""
    import tokenizers

    extra: dict[str, Any] = {}
    if weights:
        import torch

        extra = {"weights_seed": _WEIGHTS_SEED, "std": _WEIGHT_STD, "torch": torch.__version__}
    material = json.dumps(
        {
            **extra,
            "builder": _BUILDER_VERSION,
            "config": model_config(size),
            "template": CHAT_TEMPLATE,
            "special": _SPECIAL_TOKENS,
            "seed": _CORPUS_SEED,
            "sentences": _CORPUS_SENTENCES,
            "vocab": _VOCAB_SIZE,
            "tokenizers": tokenizers.__version__,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def _train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _write_weights(path: Path, config: dict[str, Any]) -> None:
    """Seeded random float32 weights, scaled so that outputs depend on the context.

    vLLM's ``--load-format dummy`` draws every weight (norms included) from +-1e-3: logits come
    out flat and independent of the prompt, so serving from wrong KV changes no output and
    a correctness test could not fail. These weights make attention matter.
    """
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(_WEIGHTS_SEED)
    h, inter = config["hidden_size"], config["intermediate_size"]
    hd, nq, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]

    def rand(*shape: int, std: float = _WEIGHT_STD) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    tensors = {"model.embed_tokens.weight": rand(config["vocab_size"], h, std=_EMBED_STD),
               "model.norm.weight": torch.ones(h)}
    for i in range(config["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        tensors |= {
            pre + "input_layernorm.weight": torch.ones(h),
            pre + "post_attention_layernorm.weight": torch.ones(h),
            pre + "self_attn.q_norm.weight": torch.ones(hd),
            pre + "self_attn.k_norm.weight": torch.ones(hd),
            pre + "self_attn.q_proj.weight": rand(nq * hd, h),
            pre + "self_attn.k_proj.weight": rand(nkv * hd, h),
            pre + "self_attn.v_proj.weight": rand(nkv * hd, h),
            pre + "self_attn.o_proj.weight": rand(h, nq * hd),
            pre + "mlp.gate_proj.weight": rand(inter, h),
            pre + "mlp.up_proj.weight": rand(inter, h),
            pre + "mlp.down_proj.weight": rand(h, inter),
        }
    save_file(tensors, str(path), metadata={"format": "pt"})


def _write(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build_local_model(root: Path, size: Size = "tiny", weights: bool = False) -> Path:
    """Return the model directory under ``root``, building it first if it is not there.

    ``weights``: also write seeded random ``model.safetensors`` (serve it without
    ``--load-format dummy``) for tests that compare outputs; dummy weights cannot tell
    right KV from wrong KV.

    The build goes to a temporary sibling and is renamed into place, so concurrent callers
    and interrupted builds never leave a half-written model that a later run would trust.
    """
    config = model_config(size)
    kind = f"{size}-w" if weights else size
    target = Path(root) / f"pdx-qwen3-{kind}-{_inputs_digest(size, weights)}"
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    work.chmod(0o755)
    try:
        tok = _train_tokenizer()
        if tok.get_vocab_size() > config["vocab_size"]:
            raise RuntimeError("tokenizer vocabulary exceeds the model's")
        for i, special in enumerate(_SPECIAL_TOKENS):
            if tok.token_to_id(special) != i:
                raise RuntimeError(f"special token {special} is not id {i}")
        tok.save(str(work / "tokenizer.json"))
        _write(work / "config.json", config)
        if weights:
            _write_weights(work / "model.safetensors", config)
        _write(
            work / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": config["max_position_embeddings"],
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
        )
        _write(
            work / "special_tokens_map.json",
            {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        )
        # No sampling defaults here: vLLM would apply them to every request.
        _write(
            work / "generation_config.json",
            {
                "bos_token_id": config["bos_token_id"],
                "eos_token_id": [config["eos_token_id"], config["pad_token_id"]],
                "pad_token_id": config["pad_token_id"],
            },
        )
        try:
            os.rename(work, target)
        except OSError:
            # Another builder won the race; its result is identical.
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    """``python -m pdx.local.localmodel DIR [--size tiny|small]``: print the model directory."""
    parser = argparse.ArgumentParser(prog="python -m pdx.local.localmodel", description=__doc__)
    parser.add_argument("root", type=Path, help="directory that holds built models")
    parser.add_argument("--size", choices=sorted(_SHAPES), default="tiny")
    parser.add_argument("--weights", action="store_true", help="write seeded random weights")
    args = parser.parse_args(argv)
    print(build_local_model(args.root, args.size, args.weights))


if __name__ == "__main__":
    main()
