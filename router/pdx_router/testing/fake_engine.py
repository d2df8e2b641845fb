"""A fake vLLM engine (prefill or decode role) with the real protocol payloads.

The engines of one `Cluster` share a registry of the blocks each decode holds, so a fake
prefill can *check* every D->P read it is asked to do: the claimed tokens must be exactly the
ones the decode holds for those positions, and the block list must end at the last block that
covers them. A wrong read is recorded, never silently served; that is what the router's
correctness tests assert on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from pdx_contract import first_token, kv_prefix
from pdx_contract import holds as holds_contract
from pdx_contract import load as load_contract
from pdx_router.chat_tokens import ChatTokenizer

EOS = 2
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class Vocab:
    """Word-level tokenizer shared by all engines of a cluster (same model)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {IM_END: EOS}
        self.words: dict[int, str] = {EOS: IM_END}

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.replace("\n", " \n ").split(" "):
            if not w:
                continue
            i = self.ids.get(w)
            if i is None:
                i = self.ids[w] = len(self.ids) + 100
                self.words[i] = w
            out.append(i)
        return out

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words.get(i, f"t{i}") for i in ids)


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """ChatML-like template (what the tiny test model in the reference uses)."""
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{IM_START} {m.get('role')} \n {content} {IM_END} \n")
    if add_generation_prompt:
        parts.append(f"{IM_START} assistant \n")
    return " ".join(parts)


@dataclass
class Read:
    """One D->P read a fake prefill was asked to perform."""

    decode_engine: str
    tokens: int
    correct: bool
    reason: str = ""


@dataclass
class Held:
    token_ids: list[int]
    block_ids: list[int]
    expiry: float


@dataclass(frozen=True)
class LocalPrefill:
    """A turn a fake decode prefilled itself (parameters that ask for no read): how much of its
    prompt that decode's prefix cache had, in whole blocks, from the turns it holds."""

    decode_engine: str
    prompt_tokens: int
    cached: int


@dataclass
class Cluster:
    """Shared state of the fake engines of one test or benchmark run."""

    block_size: int = 16
    vocab: Vocab = field(default_factory=Vocab)
    # A real model's tokenizer and chat template instead of the word vocabulary (benchmarks:
    # ids, their count and the cost of tokenizing then look like a real engine's).
    chat_tokens: ChatTokenizer | None = None
    # Prefill, decode and /tokenize see the same prompt: encode it once, so every benchmark
    # target costs the fakes the same and /tokenize looks free (which favours the hop).
    _memo: OrderedDict[str, list[int]] = field(default_factory=OrderedDict)
    held: dict[tuple[str, str], Held] = field(default_factory=dict)
    # Claims on held turns (pdx_contract.holds), and reads a valve decode's hold had none for:
    # a turn that read what the valve could have released meanwhile (must stay 0).
    claims: Counter[tuple[str, str]] = field(default_factory=Counter)
    unclaimed_reads: int = 0
    valves: set[str] = field(default_factory=set)  # engine ids of decodes with the valve
    reads: list[Read] = field(default_factory=list)
    locals: list[LocalPrefill] = field(default_factory=list)

    def read_done(self, kv: dict[str, Any]) -> None:
        """Prefill read a hold: a valve decode frees it, claims and all, as vLLM frees every hold
        once read (other fake decodes keep theirs, so that tests may read one hold twice)."""
        key = (str(kv.get("remote_engine_id")), str(kv.get("remote_request_id")))
        if key[0] in self.valves:
            self.held.pop(key, None)
            self.claims.pop(key, None)

    def encode(self, text: str) -> list[int]:
        if self.chat_tokens is None:
            return self.vocab.encode(text)
        ids = self._memo.get(text)
        if ids is None:
            ids = self._memo[text] = self.chat_tokens.encode(text)
            if len(self._memo) > 4096:
                self._memo.popitem(last=False)
        return list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.chat_tokens.tokenizer.decode(ids) if self.chat_tokens is not None else self.vocab.decode(ids)

    def chat_text(self, body: dict[str, Any]) -> str:
        text = self.chat_tokens.render(body) if self.chat_tokens is not None else None
        if text is None:
            text = render_chat(body["messages"], body.get("add_generation_prompt", True))
        return text

    def chat_ids(self, body: dict[str, Any]) -> list[int]:
        return self.encode(self.chat_text(body))

    async def encode_off_loop(self, text: str) -> list[int]:
        """encode(), with a real tokenizer's miss in a worker thread (its encode_batch releases
        the GIL): an 8k-token prompt took ~17 ms, which stalled every stream of the fakes."""
        if self.chat_tokens is None or text in self._memo:
            return self.encode(text)
        ids = await asyncio.to_thread(self.chat_tokens.encode_in_thread, text)
        self._memo[text] = ids
        if len(self._memo) > 4096:
            self._memo.popitem(last=False)
        return list(ids)


@dataclass
class EngineOptions:
    role: str
    engine_id: str
    prefill_delay: float = 0.0
    claim_delay: float = 0.0  # a claim's answer waits this long (an engine core mid-step)
    first_token_delay: float = 0.0
    token_delay: float = 0.0
    output_tokens: int = 8
    # Tests read every request back; a long benchmark must not: thousands of kept 8k-token
    # bodies made each full collection stall the fakes' loop for tens of ms.
    record: bool = True
    served_model: str = "Qwen"  # what /v1/models names (a gateway discovers the model there)
    kv_in_stream: bool = True  # vLLM 0.33 puts kv_transfer_params on the final chunk
    fail_reads: bool = False  # answer 500 to any D->P read (kv_load_failure_policy: fail)
    tokenize_differs: bool = False  # /tokenize renders unlike the chat endpoint
    decode_ttl: float = 480.0
    # Answer JSON as a re-serializing proxy would: `"key" : value , ...` and \u escapes
    # (valid JSON with the same content as vLLM's compact form).
    spaced_json: bool = False
    # Answer wrongly, on cue (the fault suite): "not_json", "wrong_content_type" (SSE to a
    # JSON request, JSON to a streamed one), "truncated_stream" (cut short), "oversized_body"
    # (malform_bytes of padding), "kv_wrong_shape" (bad_kv as kv_transfer_params),
    # "json_not_object" (an array), "junk_after_kv" (an unreadable line after the final chunk).
    malform: str | None = None
    bad_kv: Any = None
    malform_bytes: int = 1 << 16
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    # As vLLM's --api-key: /v1 paths answer 401 without `Authorization: Bearer <key>`
    # (/tokenize, /health and /metrics stay open, as in vLLM).
    api_key: str | None = None
    # Answer completions with this status and an error naming the engine's internals.
    fail_status: int | None = None
    # As the pdx engine plugin: decode names the tokens it holds, prefill checks a prompt
    # against them before it reads (pdx_contract.kv_prefix).
    checks_prefix: bool = False
    kv_recompute_threshold: int = 64
    fail_local: bool = False  # decode answers 500 to a turn it would prefill itself
    # As pdx's held-KV valve (pdx_engine.held_kv): decode answers POST /v1/pdx/holds, and
    # `release` drops an unclaimed hold as memory pressure would. Off: the route is absent.
    valve: bool = False
    notes_releases: bool = True  # each held turn's answer names the latest releases (ReleasedNote)
    load_route: bool = False  # as pdx's engine plugin: GET /v1/pdx/load answers the requests running
    # As decode with pdx_engine.first_token: a request's vllm_xargs.pdx_first_token is its first token.
    forces_first_token: bool = True


class FakeEngine:
    def __init__(self, cluster: Cluster, opts: EngineOptions) -> None:
        self.cluster = cluster
        self.opts = opts
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.auth: list[str | None] = []  # each request's Authorization header, in order
        self.cancelled = 0
        self.running = 0  # requests being served, exported as vllm:num_requests_running
        self.asked: Counter[str] = Counter()  # GETs of /metrics and the load route
        self.healthy = True
        self.releases = 0  # under pressure (`release`)
        self.released: list[str] = []  # in release order (any kind): the answers' `released` after `since`
        self.kept: dict[str, int] = {}  # holds shortened by `shorten`: the tokens still held
        self.trims = 0
        self._ids = itertools.count(1)
        self._blocks = itertools.count(1)
        self.app = web.Application()
        r = self.app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completion)
        r.add_post("/tokenize", self.tokenize)
        r.add_get("/health", self.health)
        r.add_get("/metrics", self.metrics)
        r.add_get("/lag", self.lag)
        r.add_get("/v1/models", self.models)
        if opts.valve:
            r.add_post(holds_contract.PATH, self.holds)
        if opts.load_route:
            r.add_get(load_contract.PATH, self.load)

    # ------------------------------------------------------------ helpers

    def dumps(self, obj: Any) -> bytes:
        if self.opts.spaced_json:
            return json.dumps(obj, separators=(" , ", " : ")).encode()
        return orjson.dumps(obj)

    def json_response(self, obj: Any, status: int = 200) -> web.Response:
        return web.Response(body=self.dumps(obj), status=status, content_type="application/json")

    async def prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        """Like vLLM: chat always renders its messages (no way to pass ids); completions
        take a prompt of ids as is."""
        if chat:
            return await self.cluster.encode_off_loop(self.cluster.chat_text(body))
        prompt = body["prompt"]
        if isinstance(prompt, list):
            return [int(x) for x in prompt]
        return await self.cluster.encode_off_loop(str(prompt))

    def _blocks_for(self, n: int) -> list[int]:
        return [next(self._blocks) for _ in range(-(-n // self.cluster.block_size))]

    def check_read(self, kv: dict[str, Any], prompt: list[int]) -> Read | None:
        """What real prefill would read from decode, validated against what decode holds."""
        if not (kv.get("do_remote_decode") and kv.get("remote_block_ids")):
            return None
        n = int(kv.get("remote_num_tokens") or 0)
        count = min(n, len(prompt))
        engine = str(kv.get("remote_engine_id"))
        key = (engine, str(kv.get("remote_request_id")))
        held = self.cluster.held.get(key)
        if held is not None and self.cluster.claims[key] == 0 and engine in self.cluster.valves:
            self.cluster.unclaimed_reads += 1
        if held is None:
            return Read(engine, count, False, "decode holds no such request")
        deadline = kv.get("remote_blocks_expiry_time")  # vLLM's reader goes by the params' deadline
        if time.perf_counter() > min(held.expiry, deadline if isinstance(deadline, (int, float)) else held.expiry) - 5:
            return Read(engine, count, False, "expired")
        blocks = kv["remote_block_ids"][0]
        need = -(-count // self.cluster.block_size)
        if blocks[-need:] != held.block_ids[:need] if need else False:
            return Read(engine, count, False, "block list does not end at the covering block")
        if prompt[:count] != held.token_ids[:count]:
            return Read(engine, count, False, "token ids differ: stale KV would be served")
        return Read(engine, count, True)

    def release(self, rid: str) -> bool:
        """Memory pressure on this decode: drop an unclaimed hold, as the valve does."""
        key = (self.opts.engine_id, rid)
        if self.cluster.claims[key] > 0 or self.cluster.held.pop(key, None) is None:
            return False
        self.releases += 1
        self.released.append(rid)
        return True

    def shorten(self, rid: str, blocks: int) -> bool:
        """Memory pressure on this decode: free an unclaimed hold's blocks past its first
        `blocks`, as the valve does; a read past them is then flagged incorrect."""
        key = (self.opts.engine_id, rid)
        held = self.cluster.held.get(key)
        if self.cluster.claims[key] > 0 or held is None or not 0 < blocks < len(held.block_ids):
            return False
        del held.block_ids[blocks:]
        del held.token_ids[blocks * self.cluster.block_size :]
        self.kept[rid] = blocks * self.cluster.block_size
        self.trims += 1
        return True

    # ------------------------------------------------------------ routes

    async def holds(self, req: web.Request) -> web.Response:
        asked = holds_contract.HoldsRequest.model_validate_json(await req.read())
        if self.opts.record:
            self.requests.append((req.path, asked.to_json()))
        if asked.claim:
            await asyncio.sleep(self.opts.claim_delay)
        engine = self.opts.engine_id
        for rid in asked.release_claim:
            if self.cluster.claims[(engine, rid)] > 0:
                self.cluster.claims[(engine, rid)] -= 1
        held = [rid for rid in asked.claim if (engine, rid) in self.cluster.held]
        for rid in held:
            self.cluster.claims[(engine, rid)] += 1
        if asked.release_unclaimed:
            for e, rid in [k for k in self.cluster.held if k[0] == engine and self.cluster.claims[k] == 0]:
                del self.cluster.held[(e, rid)]
                self.released.append(rid)  # named to routers, not counted as pressure
        mine = [h for (e, _), h in self.cluster.held.items() if e == engine]
        blocks = sum(len(h.block_ids) for h in mine)
        seq = len(self.released)
        since = asked.since if asked.since <= seq else 0
        answer = holds_contract.HoldsAnswer(
            held=held,
            claim_expiry=time.perf_counter() + holds_contract.CLAIM_LEASE_S if held and asked.lease else None,
            claimed=sum(1 for (e, _), n in self.cluster.claims.items() if e == engine and n > 0),
            kept={rid: self.kept[rid] for rid in held if rid in self.kept},
            trims=self.trims,
            held_blocks=blocks,
            capacity_blocks=1024,
            releases=self.releases,
            released=self.released[since:][-holds_contract.MAX_IDS :],
            seq=seq,
        )
        return self.json_response(answer.to_json())

    async def health(self, _req: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def load(self, _req: web.Request) -> web.Response:
        self.asked[load_contract.PATH] += 1
        return self.json_response(load_contract.LoadAnswer(requests=self.running).to_json())

    async def metrics(self, _req: web.Request) -> web.Response:
        self.asked["/metrics"] += 1
        text = (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.cluster.block_size}",'
            'cache_dtype="auto",engine="0"} 1.0\n'
            f'vllm:num_requests_running{{engine="0"}} {float(self.running)}\n'
            'vllm:num_requests_waiting{engine="0"} 0.0\n'
        )
        return web.Response(text=text)

    async def models(self, _req: web.Request) -> web.Response:
        model = {"id": self.opts.served_model, "object": "model", "owned_by": "vllm", "max_model_len": 32768}
        return web.json_response({"object": "list", "data": [model]})

    async def lag(self, _req: web.Request) -> web.Response:
        """The process's event-loop lag since the last ask (a benchmark checks the fakes are not
        its bottleneck): max and p99 of how late a 10 ms timer fired, in ms; then reset."""
        xs = sorted(LAGS)
        LAGS.clear()
        p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0
        return web.json_response({"samples": len(xs), "p99_ms": p99, "max_ms": xs[-1] if xs else 0.0})

    async def tokenize(self, req: web.Request) -> web.Response:
        body = await req.json(loads=orjson.loads)
        if self.opts.record:
            self.requests.append(("/tokenize", body))
            self.auth.append(req.headers.get("Authorization"))
        ids = await self.prompt_ids(body, "messages" in body)
        if self.opts.tokenize_differs and len(ids) > 1:
            ids = [*ids[:-2], ids[-1], ids[-2]]  # as if /tokenize missed a template argument
        return self.json_response({"count": len(ids), "max_model_len": 32768, "tokens": ids})

    async def chat(self, req: web.Request) -> web.StreamResponse:
        return await self._serve(req, True)

    async def completion(self, req: web.Request) -> web.StreamResponse:
        return await self._serve(req, False)

    async def _serve(self, req: web.Request, chat: bool) -> web.StreamResponse:
        body = orjson.loads(await req.read())
        if self.opts.record:
            self.requests.append((req.path, body))
            self.auth.append(req.headers.get("Authorization"))
        if self.opts.api_key is not None and req.headers.get("Authorization") != f"Bearer {self.opts.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if self.opts.fail_status is not None:
            internals = f"CUDA error on {req.host} (engine {self.opts.engine_id}): illegal memory access"
            return self.json_response(
                {"error": {"message": internals, "code": self.opts.fail_status}}, status=self.opts.fail_status
            )
        self.running += 1
        try:
            if self.opts.role == "prefill":
                return await self._prefill(body, chat)
            return await self._decode(req, body, chat)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    async def _prefill(self, body: dict[str, Any], chat: bool) -> web.Response:
        kv = dict(body.get("kv_transfer_params") or {})
        prompt = await self.prompt_ids(body, chat)
        verdict = None
        if self.opts.checks_prefix:
            verdict = kv_prefix.check_params(kv, prompt, self.opts.kv_recompute_threshold, body.get("cache_salt"))
        read = self.check_read(kv, prompt)
        if read is not None:
            self.cluster.reads.append(read)
            if self.opts.fail_reads or read.reason == "expired":
                return self.json_response({"error": {"message": "KV load failed", "code": 500}}, status=500)
        await asyncio.sleep(self.opts.prefill_delay)
        if read is not None and read.correct and read.tokens > 0:
            self.cluster.read_done(kv)
        rid = f"cmpl-{self.opts.engine_id}-{next(self._ids)}"
        out_kv = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [self._blocks_for(len(prompt))],
            "remote_engine_id": self.opts.engine_id,
            "remote_request_id": rid,
            "remote_host": self.opts.side_channel_host,
            "remote_port": self.opts.side_channel_port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": len(prompt),
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": read.tokens if read and read.correct else 0,
        }
        if verdict is not None:
            out_kv[kv_prefix.VERDICT] = verdict.to_json()
        first = self._generate(prompt)[:1]  # the token decode would start with, as a model's would be
        answer = self._full(rid, body, chat, prompt, first, out_kv, "length")
        if chat:  # its text as decode's stream gives it (policy.first_token compares the two)
            answer["choices"][0]["message"]["content"] = self.token_text(first[0])
        else:
            answer["choices"][0]["text"] = self.token_text(first[0])
        if self.opts.malform is not None:
            return self.malformed(answer)
        return self.json_response(answer)

    def token_text(self, tok: int) -> str:
        """One token's text in a stream (words end with a space; the end of text has none)."""
        return "" if tok == EOS else self.cluster.decode([tok]) + " "

    def malformed(self, answer: dict[str, Any]) -> web.Response:
        """A non-streamed answer, wrong in the way opts.malform says."""
        how = self.opts.malform
        if how == "not_json":
            return web.Response(body=b"<html><body>502 Bad Gateway</body></html>", content_type="application/json")
        if how == "wrong_content_type":
            sse = b"data: " + self.dumps(answer) + b"\n\ndata: [DONE]\n\n"
            return web.Response(body=sse, content_type="text/event-stream")
        if how == "truncated_stream":
            raw = self.dumps(answer)
            return web.Response(body=raw[: len(raw) // 2], content_type="application/json")
        if how == "oversized_body":
            return self.json_response({**answer, "padding": "x" * self.opts.malform_bytes})
        if how == "kv_wrong_shape":
            return self.json_response({**answer, "kv_transfer_params": self.opts.bad_kv})
        if how == "json_not_object":
            return web.Response(body=b"[" + self.dumps(answer) + b"]", content_type="application/json")
        raise ValueError(f"unknown malform {how!r}")

    def _full(
        self,
        rid: str,
        body: dict[str, Any],
        chat: bool,
        prompt: list[int],
        out: list[int],
        kv: dict[str, Any] | None,
        finish: str,
    ) -> dict[str, Any]:
        """A non-streamed answer as vLLM's model_dump shapes it (None fields included)."""
        ids = bool(body.get("return_token_ids"))
        text = self.cluster.decode([t for t in out if t != EOS])
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)}
        if chat:
            return {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                        "token_ids": out if ids else None,
                    }
                ],
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt if ids else None,
                "kv_transfer_params": kv,
            }
        return {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt if ids else None,
                    "token_ids": out if ids else None,
                }
            ],
            "usage": usage,
            "kv_transfer_params": kv,
        }

    def _generate(self, prompt: list[int]) -> list[int]:
        n = int(self.opts.output_tokens)
        words = [f"w{(sum(prompt[-4:]) + i) % 50}" for i in range(n - 1)]
        return [*self.cluster.encode(" ".join(words)), EOS]

    def _hold(self, rid: str, prompt: list[int], out: list[int], salt: str | None = None) -> dict[str, Any]:
        n = len(prompt) + len(out) - 1
        blocks = self._blocks_for(n)
        expiry = time.perf_counter() + self.opts.decode_ttl
        held = [*prompt, *out][:n]
        self.cluster.held[(self.opts.engine_id, rid)] = Held(held, blocks, expiry)
        kv = {
            "do_remote_prefill": False,
            "do_remote_decode": True,
            "remote_block_ids": [blocks],
            "remote_engine_id": self.opts.engine_id,
            "remote_request_id": rid,
            "remote_host": self.opts.side_channel_host,
            "remote_port": self.opts.side_channel_port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": n,
            "remote_blocks_expiry_time": expiry,
            "transfer_mode": "pull",
        }
        if self.opts.checks_prefix:
            kv_prefix.hold_params(kv, held, self.cluster.block_size, salt)
        if self.released and self.opts.notes_releases:
            note = holds_contract.ReleasedNote.latest(len(self.released), lambda since: self.released[since:])
            kv[holds_contract.RELEASED_KV] = note.to_json()
        return kv

    def cached(self, prompt: list[int]) -> int:
        """This decode's prefix-cache hit for `prompt`: the longest common prefix with a turn
        it holds, in whole blocks (vLLM's cache is exact by block hash)."""
        best = 0
        for (engine, _), held in self.cluster.held.items():
            if engine != self.opts.engine_id:
                continue
            n = 0
            for a, b in zip(held.token_ids, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best - best % self.cluster.block_size

    async def _decode(self, req: web.Request, body: dict[str, Any], chat: bool) -> web.StreamResponse:
        prompt = await self.prompt_ids(body, chat)
        kv_in = body.get("kv_transfer_params")
        if isinstance(kv_in, dict) and kv_in and not (kv_in.get("do_remote_prefill") or kv_in.get("do_remote_decode")):
            if self.opts.fail_local:
                return self.json_response({"error": {"message": "local prefill failed", "code": 500}}, status=500)
            self.cluster.locals.append(LocalPrefill(self.opts.engine_id, len(prompt), self.cached(prompt)))
        rid = f"cmpl-{self.opts.engine_id}-{next(self._ids)}"
        out = self._generate(prompt)
        forced = (body.get("vllm_xargs") or {}).get(first_token.ARG)
        if self.opts.forces_first_token and type(forced) is int:
            out = [forced, *out[1:]]
        ids = bool(body.get("return_token_ids"))
        await asyncio.sleep(self.opts.first_token_delay)
        if not body.get("stream"):
            await asyncio.sleep(self.opts.token_delay * (len(out) - 1))
            kv = self._hold(rid, prompt, out, body.get("cache_salt"))
            if self.opts.malform is not None:
                return self.malformed(self._full(rid, body, chat, prompt, out, kv, "stop"))
            return self.json_response(self._full(rid, body, chat, prompt, out, kv, "stop"))
        if self.opts.malform == "wrong_content_type":  # a proxy that answers streams as JSON
            kv = self._hold(rid, prompt, out, body.get("cache_salt"))
            return self.json_response(self._full(rid, body, chat, prompt, out, kv, "stop"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict[str, Any], **extra: Any) -> bytes:
            c: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": body.get("model")}
            c["choices"] = [choice]
            c.update(extra)
            return b"data: " + self.dumps(c) + b"\n\n"

        if chat:
            first: dict[str, Any] = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            await resp.write(chunk(first, **({"prompt_token_ids": prompt} if ids else {})))
        for i, tok in enumerate(out):
            if i:
                await asyncio.sleep(self.opts.token_delay)
            last = i == len(out) - 1
            text = self.token_text(tok)
            choice: dict[str, Any] = {"index": 0}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
                if i == 0 and ids:
                    choice["prompt_token_ids"] = prompt
            choice["logprobs"] = None
            choice["finish_reason"] = "stop" if last else None
            if last:
                choice["stop_reason"] = None
            if ids:
                choice["token_ids"] = [tok]
            extra: dict[str, Any] = {}
            if last:
                kv = self._hold(rid, prompt, out, body.get("cache_salt"))
                if self.opts.kv_in_stream:
                    extra["kv_transfer_params"] = kv
            bad = self.opts.malform
            if bad == "truncated_stream" and i == len(out) // 2:
                await resp.write(chunk(choice, **extra)[:20])  # cut inside a line, then EOF
                await resp.write_eof()
                return resp
            if last and bad == "kv_wrong_shape":
                extra["kv_transfer_params"] = self.opts.bad_kv
            if last and bad == "not_json":
                await resp.write(chunk(choice, **extra)[:-3] + b",}\n\n")
                continue
            if last and bad == "json_not_object":
                await resp.write(b"data: [" + chunk(choice, **extra)[6:-2] + b"]\n\n")
                continue
            if last and bad == "junk_after_kv":  # one write: one block for the router
                await resp.write(chunk(choice, **extra) + b'data: {"kv_transfer_params": oops\n\n')
                continue
            if i == 1 and bad == "oversized_body":
                await resp.write(chunk({**choice, "padding": "x" * self.opts.malform_bytes}))
            await resp.write(chunk(choice, **extra))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def start_engine(
    cluster: Cluster, opts: EngineOptions, host: str = "127.0.0.1", port: int = 0
) -> tuple[FakeEngine, web.AppRunner, str]:
    """Start a fake engine on loopback; returns it, its runner and its base URL."""
    engine = FakeEngine(cluster, opts)
    if opts.valve:
        cluster.valves.add(opts.engine_id)
    runner = web.AppRunner(engine.app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return engine, runner, f"http://{shown}:{bound}"


LAGS: list[float] = []  # loop lag samples in ms (_sample_lag), read and reset by GET /lag


async def _sample_lag(period: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(period)
        LAGS.append((loop.time() - t0 - period) * 1000)
        del LAGS[:-100_000]


async def _serve_pair(args: Any) -> None:
    cluster = Cluster(chat_tokens=ChatTokenizer.from_dir(args.tokenizer) if args.tokenizer else None)
    common = {
        "first_token_delay": args.first_token_delay,
        "token_delay": args.token_delay,
        "output_tokens": args.output_tokens,
        "prefill_delay": args.prefill_delay,
        "record": False,
        "checks_prefix": args.checks_prefix,
    }
    await start_engine(cluster, EngineOptions("prefill", "prefill-0", **common), port=args.prefill_port)
    await start_engine(cluster, EngineOptions("decode", "decode-0", **common, valve=args.valve), port=args.decode_port)
    print("fake engines ready", flush=True)
    await _sample_lag()


def main() -> None:
    """`python -m pdx_router.testing.fake_engine`: a prefill and a decode in one process."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--prefill-port", type=int, required=True)
    p.add_argument("--decode-port", type=int, required=True)
    p.add_argument("--prefill-delay", type=float, default=0.02)
    p.add_argument("--first-token-delay", type=float, default=0.005)
    p.add_argument("--token-delay", type=float, default=0.002)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--tokenizer", help="model directory whose tokenizer and chat template to use")
    p.add_argument("--checks-prefix", action="store_true", help="as the pdx engine plugin (kv_prefix)")
    p.add_argument("--valve", action="store_true", help="decode answers claims on its held KV (pdx_engine.held_kv)")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve_pair(p.parse_args()))


if __name__ == "__main__":
    main()
