"""Hand probe of the 3-hop P/D protocol against a running pair (scripts/dev/pd_pair.sh).

Prints the payloads that docs/engine-notes.md quotes. Not a test: a lab notebook.
Usage: .venv/bin/python scripts/dev/pd_probe.py {chat,completions,expired} [...]
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

P = "http://127.0.0.1:8100"
D = "http://127.0.0.1:8200"
FIRST_HOP = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
BLOCK = 128


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.load(r), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), time.perf_counter() - t0


def stream(url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    req = urllib.request.Request(
        url, json.dumps({**body, "stream": True}).encode(), {"content-type": "application/json"}
    )
    chunks = []
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks, time.perf_counter() - t0


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def filler(n: int, seed: int) -> str:
    words = "agent tool file error result value token cache block prefill decode turn".split()
    return " ".join(words[(i * 7 + seed) % len(words)] + str(i % 13) for i in range(n))


def hop(kind: str, body: dict[str, Any], kv: dict[str, Any], max_tokens: int = 16) -> dict[str, Any]:
    """Prefill (max_tokens 1) then streamed decode; returns what the router would keep."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    base = {"model": "pdx", "temperature": 0, "return_token_ids": True, **body}
    code, pre, t_pre = post(P + path, {**base, "max_tokens": 1, "stream": False, "kv_transfer_params": kv})
    if code != 200:
        return {"prefill_status": code, "prefill_body": pre, "prefill_s": t_pre}
    ptp = pre["kv_transfer_params"]
    chunks, t_dec = stream(
        D + path,
        {**base, "max_tokens": max_tokens, "ignore_eos": True, "kv_transfer_params": ptp,
         "logprobs": True if kind == "chat" else 1, **({"top_logprobs": 1} if kind == "chat" else {})},
    )
    prompt_ids = next(c["prompt_token_ids"] for c in chunks if c.get("prompt_token_ids")) if kind == "chat" \
        else next(c["choices"][0]["prompt_token_ids"] for c in chunks if c["choices"] and c["choices"][0].get("prompt_token_ids"))
    gen = [t for c in chunks for ch in c["choices"] for t in (ch.get("token_ids") or [])]
    text = "".join((ch.get("delta", {}).get("content") or ch.get("text") or "") for c in chunks for ch in c["choices"])
    lps: list[float] = []
    for c in chunks:
        for ch in c["choices"]:
            lp = ch.get("logprobs") or {}
            if kind == "chat":
                lps += [x["logprob"] for x in lp.get("content") or []]
            else:
                lps += lp.get("token_logprobs") or []
    final = [c for c in chunks if "kv_transfer_params" in c]
    return {
        "prefill_kv": ptp, "prefill_s": round(t_pre, 3), "decode_s": round(t_dec, 3),
        "prefill_usage": pre.get("usage"), "prefill_prompt_ids_len": len(pre.get("prompt_token_ids") or pre["choices"][0].get("prompt_token_ids") or []),
        "decode_kv": final[-1]["kv_transfer_params"] if final else None,
        "final_chunk": final[-1] if final else None,
        "prompt_ids": prompt_ids, "gen_ids": gen, "text": text, "logprobs": lps,
    }


def reuse_params(prev: dict[str, Any], new_prompt: list[int], cut: bool = True, align: bool = False) -> dict[str, Any]:
    held = prev["prompt_ids"] + prev["gen_ids"][:-1]
    kv = dict(prev["decode_kv"])
    assert kv["remote_num_tokens"] == len(held), (kv["remote_num_tokens"], len(held))
    n = min(lcp(held, new_prompt), len(new_prompt) - 1)
    if align:
        n -= n % BLOCK
    kv["remote_num_tokens"] = n
    if cut:
        kv["remote_block_ids"] = [g[: -(-n // BLOCK)] for g in kv["remote_block_ids"]]
    return kv


def tokenize_chat(messages: list[dict[str, str]]) -> list[int]:
    _, r, _ = post(P + "/tokenize", {"model": "pdx", "messages": messages, "add_generation_prompt": True})
    return list(r["tokens"])


def show(tag: str, r: dict[str, Any]) -> None:
    slim = {k: v for k, v in r.items() if k not in ("prompt_ids", "logprobs", "final_chunk")}
    print(f"== {tag}: {json.dumps(slim)[:1500]}")


def chat(mode: str = "cut") -> None:
    msgs = [{"role": "system", "content": "You are a coding agent. " + filler(300, 1)},
            {"role": "user", "content": "Turn one: " + filler(120, 2)}]
    r1 = hop("chat", {"messages": msgs}, FIRST_HOP)
    show("chat turn1", r1)
    print("final streamed chunk:", json.dumps(r1["final_chunk"]))
    for turn in (2, 3):
        said = r1["text"][:-7] if mode in ("edit", "nocut") else r1["text"]
        msgs = [*msgs, {"role": "assistant", "content": said}, {"role": "user", "content": f"Turn {turn}: " + filler(80, turn)}]
        ids = tokenize_chat(msgs)
        held = r1["prompt_ids"] + r1["gen_ids"][:-1]
        print(f"turn{turn}: tokenize len={len(ids)} held={len(held)} lcp={lcp(held, ids)} decode remote_num_tokens={r1['decode_kv']['remote_num_tokens']}")
        base = hop("chat", {"messages": msgs}, FIRST_HOP)
        kv = reuse_params(r1, ids, cut=(mode != "nocut"), align=(mode == "align"))
        print("turn", turn, "reuse params sent to prefill:", json.dumps(kv), "base decode_s", base["decode_s"])
        r2 = hop("chat", {"messages": msgs}, kv)
        show(f"chat turn{turn} reuse", r2)
        print(f"turn{turn}: tokenize==chat prompt ids: {ids == r2['prompt_ids']}; greedy equal: {base['gen_ids'] == r2['gen_ids']}; "
              f"max |dlogprob|={max((abs(a - b) for a, b in zip(base['logprobs'], r2['logprobs'], strict=False)), default=None)}; "
              f"prefill s base={base['prefill_s']} reuse={r2['prefill_s']}")
        r1 = r2


def completions() -> None:
    prompt = "<|im_start|>system\n" + filler(400, 3) + "<|im_end|>\n"
    r1 = hop("completions", {"prompt": prompt}, FIRST_HOP)
    show("cmpl turn1", r1)
    print("final streamed chunk:", json.dumps(r1["final_chunk"]))
    for turn in (2, 3):
        held = r1["prompt_ids"] + r1["gen_ids"]
        ids = held + list(range(300, 300 + 90))  # token-id prompt: exact continuation
        base = hop("completions", {"prompt": ids}, FIRST_HOP)
        kv = reuse_params(r1, ids)
        print("turn", turn, "reuse params:", json.dumps(kv))
        r2 = hop("completions", {"prompt": ids}, kv)
        show(f"cmpl turn{turn} reuse", r2)
        print(f"turn{turn}: greedy equal: {base['gen_ids'] == r2['gen_ids']}; max |dlogprob|="
              f"{max((abs(a - b) for a, b in zip(base['logprobs'], r2['logprobs'], strict=False)), default=None)}; "
              f"prefill s base={base['prefill_s']} reuse={r2['prefill_s']}")
        r1 = r2


def expired(wait: float) -> None:
    prompt = filler(400, 5)
    r1 = hop("completions", {"prompt": prompt}, FIRST_HOP)
    print("decode kv:", json.dumps(r1["decode_kv"]))
    print(f"sleeping {wait}s"); time.sleep(wait)
    ids = r1["prompt_ids"] + r1["gen_ids"] + list(range(300, 400))
    kv = reuse_params(r1, ids)
    code, body, t = post(P + "/v1/completions", {"model": "pdx", "prompt": ids, "max_tokens": 1, "temperature": 0, "kv_transfer_params": kv})
    print(f"prefill answered HTTP {code} in {t:.3f}s: {json.dumps(body)[:800]}")


def teeth() -> None:
    """Turn 2 edits turn 1's user message: compare no reuse, LCP reuse (cut / uncut), blind reuse."""
    user1 = "Turn one: " + filler(120, 2)
    msgs = [{"role": "system", "content": "You are a coding agent. " + filler(300, 1)},
            {"role": "user", "content": user1}]
    r1 = hop("chat", {"messages": msgs}, FIRST_HOP)
    print("turn1 prefill_s", r1["prefill_s"], "decode_s", r1["decode_s"])
    msgs2 = [msgs[0], {"role": "user", "content": "EDITED " + user1[40:]},
             {"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "Turn 2: " + filler(80, 2)}]
    ids = tokenize_chat(msgs2)
    held = r1["prompt_ids"] + r1["gen_ids"][:-1]
    print(f"held={len(held)} new={len(ids)} lcp={lcp(held, ids)}")
    base = hop("chat", {"messages": msgs2}, FIRST_HOP)
    runs = {"cut": reuse_params(r1, ids), "uncut": reuse_params(r1, ids, cut=False), "blind": dict(r1["decode_kv"])}
    for name, kv in runs.items():
        r = hop("chat", {"messages": msgs2}, kv)
        if "prefill_status" in r:
            print(name, "prefill failed", r["prefill_status"], json.dumps(r["prefill_body"])[:300])
            continue
        d = max((abs(a - b) for a, b in zip(base["logprobs"], r["logprobs"], strict=False)), default=None)
        print(f"{name}: sent R={kv['remote_num_tokens']} blocks={kv['remote_block_ids']} -> cached={r['prefill_kv']['remote_prefill_cached_tokens']} "
              f"greedy equal={base['gen_ids'] == r['gen_ids']} max|dlogprob|={d} gen={r['gen_ids'][:6]} base={base['gen_ids'][:6]}")
        # each hop consumed decode's blocks: refresh turn 1 for the next variant
        r1 = hop("chat", {"messages": msgs}, FIRST_HOP)
        runs_next = {"cut": reuse_params(r1, ids), "uncut": reuse_params(r1, ids, cut=False), "blind": dict(r1["decode_kv"])}
        runs.update(runs_next)


def killed(pidfile: str) -> None:
    """Turn 1, then kill decode (SIGKILL, whole group of its pid), then turn 2 at prefill with decode's params."""
    import os
    import signal

    r1 = hop("completions", {"prompt": filler(400, 9)}, FIRST_HOP)
    print("decode kv:", json.dumps(r1["decode_kv"]))
    pid = int(open(pidfile).read())
    children = os.popen(f"pgrep -P {pid}").read().split()
    for p in [pid, *map(int, children)]:
        os.kill(p, signal.SIGKILL)
    time.sleep(2)
    ids = r1["prompt_ids"] + r1["gen_ids"] + list(range(300, 400))
    kv = reuse_params(r1, ids)
    code, body, t = post(P + "/v1/completions", {"model": "pdx", "prompt": ids, "max_tokens": 1, "temperature": 0, "kv_transfer_params": kv})
    print(f"decode killed; prefill answered HTTP {code} in {t:.3f}s: {json.dumps(body)[:600]}")
    code, body, t = post(P + "/v1/completions", {"model": "pdx", "prompt": ids, "max_tokens": 1, "temperature": 0, "kv_transfer_params": FIRST_HOP})
    print(f"retry without reuse: HTTP {code} in {t:.3f}s")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "chat":
        chat(sys.argv[2] if len(sys.argv) > 2 else "cut")
    elif what == "completions":
        completions()
    elif what == "teeth":
        teeth()
    elif what == "killed":
        killed(sys.argv[2])
    elif what == "expired":
        expired(float(sys.argv[2]))


