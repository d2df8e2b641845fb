"""The HTTP server: OpenAI front, the prefill -> decode flow, retry without reuse.

Decisions come from policy.py; this module only moves bytes, measures and records.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import policy
from .chat_tokens import ChatTokenizer, TextPrefix, Trust
from .config import RouterConfig
from .discovery import Discovery, Pool
from .endpoints import Endpoint
from .entries import Entry
from .metrics import Metrics
from .policy import Outcome
from .store import MemoryStore, RedisStore, Store
from .upstream import (
    Captured,
    ClientFacingError,
    StreamFilter,
    Upstream,
    UpstreamError,
    filter_response,
)

log = logging.getLogger("pdx_router")

CONFIG: web.AppKey[RouterConfig] = web.AppKey("config", RouterConfig)


def make_store(cfg: RouterConfig) -> Store:
    if cfg.store.kind == "redis":
        assert cfg.store.url is not None
        return RedisStore(cfg.store.url, cfg.store.key_prefix, cfg.max_entries)
    return MemoryStore(cfg.max_entries)


def tenant_of(headers: Any, tenant_header: str | None) -> str:
    """The tenant an entry belongs to: a configured header, else a hash of the API key."""
    if tenant_header:
        return str(headers.get(tenant_header, ""))
    auth = headers.get("Authorization")
    return hashlib.sha256(auth.encode()).hexdigest()[:32] if auth else ""


def entry_key(tenant: str, conversation: str) -> str:
    """Tenant-scoped store key; hashed so ids of any length or charset are safe in Redis."""
    return hashlib.sha256(f"{tenant}\x00{conversation}".encode()).hexdigest()


@dataclass
class Turn:
    """Per-request state threaded through the flow."""

    path: str
    is_chat: bool
    body: dict[str, Any]
    stream: bool
    client_wants_ids: bool
    capture: bool
    key: str | None
    headers: dict[str, str]
    started: float
    outcome: Outcome = Outcome.NONE
    reused_tokens: int = 0
    prefill_ms: float = 0.0
    compared_ids: list[int] | None = None  # the prompt ids reuse was planned on (HIT turns)
    local_ids: bool = False  # ...and they came from the router's own tokenizer
    text: str | None = None  # the chat prompt as the router's tokenizer renders it


class NoEngines(Exception):
    pass


# Whole prompts the router's tokenizer must get right before its ids replace /tokenize.
PROBATION_TURNS = 8


class Router:
    def __init__(self, cfg: RouterConfig, store: Store | None = None) -> None:
        self.cfg = cfg
        self.chat_tokens = ChatTokenizer.from_dir(cfg.tokenizer) if cfg.tokenizer else None
        self.trust = Trust(PROBATION_TURNS)
        self.pool = Pool()
        self.upstream = Upstream(cfg.upstream_timeout_seconds)
        self.store = store if store is not None else make_store(cfg)
        self.metrics = Metrics()
        self.discovery = Discovery(cfg, self.pool, self.upstream)

    # ------------------------------------------------------------ lifecycle

    async def start(self, _app: web.Application) -> None:
        await self.upstream.start()
        await self.discovery.start()

    async def stop(self, _app: web.Application) -> None:
        await self.discovery.stop()
        await self.upstream.close()
        await self.store.close()

    # ------------------------------------------------------------ small routes

    async def health(self, _req: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, _req: web.Request) -> web.Response:
        gen = policy.choose_generation(self.pool.endpoints, self.cfg.generation)
        if gen is None:
            return web.json_response({"ready": False, "reason": "no healthy P/D pair"}, status=503)
        return web.json_response({"ready": True, "generation": gen})

    async def models(self, _req: web.Request) -> web.Response:
        model = {"id": self.cfg.served_model_name, "object": "model", "owned_by": "pdx"}
        return web.json_response({"object": "list", "data": [model]})

    async def metrics_route(self, _req: web.Request) -> web.Response:
        with contextlib.suppress(Exception):
            self.metrics.entries.set(await self.store.count())
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(self, _req: web.Request) -> web.Response:
        entries = await self.store.count()
        stats = self.metrics.stats(entries)
        stats["routerTokenizer"] = self.trust.state if self.chat_tokens is not None else "off"
        return web.Response(body=orjson.dumps(stats), content_type="application/json")

    # ------------------------------------------------------------ completions

    async def chat(self, req: web.Request) -> web.StreamResponse:
        return await self._complete(req, "/v1/chat/completions", True)

    async def completions(self, req: web.Request) -> web.StreamResponse:
        return await self._complete(req, "/v1/completions", False)

    async def _complete(self, req: web.Request, path: str, is_chat: bool) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            raw = await req.read()
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        conversation = body.get("conversation_id") or req.headers.get("X-Session-ID")
        body, wants_ids = policy.clean_client_body(body)
        key = None
        if conversation:
            key = entry_key(tenant_of(req.headers, self.cfg.tenant_header), str(conversation))
        headers = {"Authorization": req.headers["Authorization"]} if "Authorization" in req.headers else {}
        turn = Turn(
            path=path,
            is_chat=is_chat,
            body=body,
            stream=bool(body.get("stream")),
            client_wants_ids=wants_ids,
            capture=key is not None and body.get("n", 1) in (1, None),
            key=key,
            headers=headers,
            started=started,
        )
        try:
            try:
                return await self._serve(req, turn)
            except NoEngines:
                # An engine may have come back since the last periodic check: look once now
                # rather than fail a client for up to a health-check interval.
                await self.discovery.check_all()
                return await self._serve(req, turn)
        except NoEngines:
            return _error(503, "no healthy prefill/decode pair of one generation")
        except ClientFacingError as exc:
            return web.Response(status=exc.status, body=exc.body, content_type=exc.content_type)
        except UpstreamError as exc:
            self.metrics.upstream_errors.labels(exc.endpoint.role).inc()
            return _error(502, f"engine failed: {exc}")

    def _generation(self) -> str:
        gen = policy.choose_generation(self.pool.endpoints, self.cfg.generation)
        if gen is None:
            raise NoEngines
        return gen

    async def _plan(
        self, turn: Turn, gen: str, prefill: Endpoint
    ) -> tuple[Entry | None, policy.ReusePlan, list[int] | None]:
        """Take the conversation's entry and decide on reuse (tokenizing only if needed)."""
        assert turn.key is not None
        entry = await self.store.take(turn.key)
        now = time.time()
        if entry is not None:
            self.metrics.inter_turn_gap(now - entry.stored_at)
        reason = policy.check_entry(entry, now, self.pool.endpoints, gen)
        if reason is not None or entry is None:
            return entry, policy.ReusePlan(reason or Outcome.MISS), None
        ids = None if turn.is_chat else policy.prompt_ids_of_completion(turn.body)
        if ids is None and turn.is_chat and self.chat_tokens is not None and self.trust.trusted:
            turn.text = self.chat_tokens.render(turn.body)
            if turn.text is not None:
                ids = self.chat_tokens.resume(turn.text, entry.prefix, entry.token_ids)
                turn.local_ids = ids is not None
                if turn.local_ids:
                    self.metrics.prompt_ids_from("local")
        if ids is None:
            ids = await self._tokenize(prefill, turn)
        if ids is None:
            return entry, policy.ReusePlan(Outcome.PREFIX_MISMATCH), None
        return entry, policy.plan_reuse(entry, ids, self.cfg.kv_recompute_threshold), ids

    async def _tokenize(self, prefill: Endpoint, turn: Turn) -> list[int] | None:
        """The prompt's ids from the engine, rendered with the request's template arguments."""
        tok = policy.tokenize_body(turn.body, turn.is_chat, turn.body.get("model"))
        if tok is None:
            return None
        try:
            answer = await self.upstream.post_json(prefill, "/tokenize", tok, turn.headers)
        except (UpstreamError, ClientFacingError) as exc:
            log.warning("tokenize failed, no reuse this turn: %s", exc)
            return None
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            return None
        self.metrics.prompt_ids_from("engine")
        return tokens

    async def _serve(self, req: web.Request, turn: Turn) -> web.StreamResponse:
        gen = self._generation()
        prefill = policy.choose_prefill(self.pool.endpoints, gen)
        assert prefill is not None
        entry: Entry | None = None
        plan = policy.ReusePlan(Outcome.NONE)
        ids: list[int] | None = None
        if turn.key is not None:
            entry, plan, ids = await self._plan(turn, gen, prefill)
        turn.outcome = plan.outcome
        affinity = entry.decode_url if entry is not None else None

        for attempt in (0, 1):
            reuse = plan.outcome is Outcome.HIT and attempt == 0
            if attempt:
                gen = self._generation()
                prefill = policy.choose_prefill(self.pool.endpoints, gen) or prefill
            decode = policy.choose_decode(self.pool.endpoints, gen, affinity)
            if decode is None:
                raise NoEngines
            ppath, pbody = policy.prefill_request(turn.body, turn.is_chat, turn.path, plan.kv if reuse else None, ids)
            turn.compared_ids = ids if reuse else None
            _log_hop("to prefill", prefill, pbody.get("kv_transfer_params"))
            t0 = time.perf_counter()
            try:
                answer = await self._call(prefill, ppath, turn, pbody)
            except UpstreamError as exc:
                self.metrics.upstream_errors.labels("prefill").inc()
                if attempt == 0 and (reuse or exc.status is None):
                    if exc.status is None:
                        prefill.healthy = False
                    if reuse:
                        # Declined or failed read of decode's blocks: never the client's
                        # problem. Retry this turn as plain P/D.
                        turn.outcome = Outcome.DECLINED
                        log.info("reuse declined by %s (%s); retrying without reuse", prefill.url, exc.status)
                    continue
                raise
            turn.prefill_ms = (time.perf_counter() - t0) * 1000
            self.metrics.prefill.observe(turn.prefill_ms / 1000)
            turn.reused_tokens = plan.tokens if reuse else 0
            pkv = answer.get("kv_transfer_params")
            dbody = policy.decode_body(turn.body, pkv if isinstance(pkv, dict) else None, want_token_ids=turn.capture)
            if reuse and ids is not None and not turn.is_chat:
                dbody = policy.pin_completion_prompt(dbody, ids)
            _log_hop("to decode", decode, dbody.get("kv_transfer_params"))
            try:
                return await self._decode(req, turn, decode, dbody)
            except UpstreamError as exc:
                self.metrics.upstream_errors.labels("decode").inc()
                if attempt == 0 and exc.status is None:
                    decode.healthy = False
                    affinity = None
                    if reuse:
                        turn.outcome = Outcome.EXPIRED
                    continue
                raise
        raise AssertionError("unreachable")

    async def _call(self, ep: Endpoint, path: str, turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
        ep.outstanding += 1
        try:
            return await self.upstream.post_json(ep, path, body, turn.headers)
        finally:
            ep.outstanding -= 1

    def _pdx_headers(self, turn: Turn) -> dict[str, str]:
        return {
            "X-PDX-Prefill-Ms": f"{turn.prefill_ms:.1f}",
            "X-PDX-Reuse": turn.outcome.value,
            "X-PDX-Reused-Tokens": str(turn.reused_tokens),
        }

    async def _decode(self, req: web.Request, turn: Turn, decode: Endpoint, body: dict[str, Any]) -> web.StreamResponse:
        decode.outstanding += 1
        try:
            try:
                ctx = self.upstream.open(decode, turn.path, body, turn.headers)
                resp = await ctx.__aenter__()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamError(decode, None, repr(exc)) from exc
            try:
                if resp.status >= 400:
                    raw = await resp.read()
                    if resp.status >= 500:
                        raise UpstreamError(decode, resp.status, raw[:300].decode(errors="replace"))
                    raise ClientFacingError(resp.status, raw, resp.content_type)
                if turn.stream:
                    out = await self._relay_stream(req, turn, resp, decode)
                else:
                    out = await self._relay_json(req, turn, resp, decode)
            finally:
                await ctx.__aexit__(None, None, None)
        finally:
            decode.outstanding -= 1
        self._finish(turn)
        return out

    async def _relay_stream(
        self, req: web.Request, turn: Turn, resp: aiohttp.ClientResponse, decode: Endpoint
    ) -> web.StreamResponse:
        out = _EventStream(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **self._pdx_headers(turn),
            }
        )
        await out.prepare(req)
        filt = StreamFilter(capture=turn.capture, strip_ids=not turn.client_wants_ids)
        passthrough = not turn.capture and turn.client_wants_ids
        first, stored = True, False

        async def store_once_captured() -> None:
            # Before the client can see the end of the turn: an agent sends the next turn as
            # soon as it has [DONE], and that turn must find this entry.
            nonlocal stored
            if not stored and filt.captured.kv is not None:
                stored = True
                await self._store_entry(turn, decode, filt.captured)

        try:
            # Whole socket reads, not lines: each client write is a chunked-encoding frame and
            # a send(), which dominated the router's CPU when done per SSE line.
            async for block in resp.content.iter_any():
                if not passthrough:
                    block = filt.feed(block)
                    await store_once_captured()
                if not block:
                    continue
                await out.write(block)
                if first and b"data: " in block:
                    first = False
                    self.metrics.ttft.observe(time.perf_counter() - turn.started)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("decode stream broke: %r", exc)
            filt.captured.kv = None  # incomplete turn: do not store
        if not passthrough and (rest := filt.flush()):
            await store_once_captured()
            await out.write(rest)
        await out.write_eof()
        return out

    async def _relay_json(
        self, req: web.Request, turn: Turn, resp: aiohttp.ClientResponse, decode: Endpoint
    ) -> web.StreamResponse:
        try:
            data = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise UpstreamError(Endpoint(str(resp.url), "decode", ""), None, repr(exc)) from exc
        cap = filter_response(data, turn.capture, strip_ids=not turn.client_wants_ids)
        self.metrics.ttft.observe(time.perf_counter() - turn.started)
        await self._store_entry(turn, decode, cap)  # the answer leaves after the handler returns
        out = web.Response(body=orjson.dumps(data), content_type="application/json", headers=self._pdx_headers(turn))
        return out

    def _finish(self, turn: Turn) -> None:
        """Record the turn and log the line the seed's data collection reads."""
        self.metrics.outcome(turn.outcome, turn.reused_tokens)
        log.info(
            "Prefill done in %.0fms reuse=%s reused_tokens=%d total=%.0fms",
            turn.prefill_ms,
            turn.outcome.value,
            turn.reused_tokens,
            (time.perf_counter() - turn.started) * 1000,
        )

    async def _store_entry(self, turn: Turn, decode: Endpoint, cap: Captured) -> None:
        """Keep what decode holds for this conversation's next turn."""
        _log_hop("from decode", decode, cap.kv)
        if turn.key is None or not turn.capture or cap.choices > 1:
            return
        if not policy.prompt_ids_agree(turn.compared_ids, cap.prompt_ids):
            # The reuse decision was made on ids the engine did not use (/tokenize missed a
            # template argument, or the router's tokenizer rendered differently). Keep nothing,
            # so the conversation's next turn cannot build on it.
            self.metrics.tokenize_mismatched()
            source = "the router's tokenizer" if turn.local_ids else "/tokenize"
            log.warning("prompt ids from %s differ from those decode used; entry dropped", source)
            if turn.local_ids:
                self._distrust()
            return
        entry = policy.make_entry(
            cap.kv,
            cap.prompt_ids,
            cap.output_ids,
            decode,
            time.time(),
            self.cfg.conversation_ttl_seconds,
        )
        if entry is not None:
            prefix = await self._prefix_for_next_turn(turn, cap.prompt_ids)
            await self._put(turn.key, replace(entry, prefix=prefix) if prefix is not None else entry)

    async def _prefix_for_next_turn(self, turn: Turn, prompt_ids: list[int] | None) -> TextPrefix | None:
        """Where the router's tokenizer can resume next turn; on probation, first check it
        tokenizes this whole prompt exactly as the engine did."""
        tok = self.chat_tokens
        if tok is None or self.trust.off or not turn.is_chat or not prompt_ids:
            return None
        text = turn.text if turn.text is not None else tok.render(turn.body)
        if text is None:
            return None
        if not self.trust.trusted:
            # A whole prompt, 8 times per process: off the event loop.
            if await asyncio.to_thread(tok.encode_in_thread, text) != prompt_ids:
                self._distrust()
                return None
            self.trust.record(True)
            if self.trust.trusted:
                log.info("the router's tokenizer matched the engine on %d prompts: using it", self.trust.agreed)
        return tok.prefix_of(text, prompt_ids)

    def _distrust(self) -> None:
        if not self.trust.off:
            log.error("the router's tokenizer disagrees with the engine's: /tokenize from now on")
        self.trust.record(False)

    async def _put(self, key: str, entry: Entry) -> None:
        try:
            await self.store.put(key, entry)
        except Exception as exc:  # a store outage must not fail requests
            log.warning("store.put failed: %r", exc)


ROUTER = web.AppKey("router", Router)


class _EventStream(web.StreamResponse):
    """The status line and headers leave with the first event: one send() on the TTFT path
    instead of two. (aiohttp's web.Response sets the same class attribute.)"""

    _send_headers_immediately = False


def _log_hop(what: str, ep: Endpoint, kv: Any) -> None:
    """`--log-level debug`: the exact kv_transfer_params of every hop, one line each."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s %s kv_transfer_params=%s", what, ep.url, orjson.dumps(kv).decode())


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "pdx_router_error", "code": status}}, status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def count_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    router: Router = request.app[ROUTER]
    try:
        resp = await handler(request)
    except web.HTTPException as exc:
        router.metrics.requests.labels(request.path, str(exc.status)).inc()
        raise
    router.metrics.requests.labels(request.path, str(resp.status)).inc()
    return resp


def build_app(cfg: RouterConfig, store: Store | None = None) -> web.Application:
    """An aiohttp app; the request-size limit makes aiohttp answer 413 by itself."""
    router = Router(cfg, store)
    app = web.Application(client_max_size=cfg.max_request_bytes, middlewares=[count_requests])
    app[CONFIG] = cfg
    app[ROUTER] = router
    app.on_startup.append(router.start)
    app.on_cleanup.append(router.stop)
    app.router.add_post("/v1/chat/completions", router.chat)
    app.router.add_post("/v1/completions", router.completions)
    app.router.add_get("/v1/models", router.models)
    app.router.add_get("/health", router.health)
    app.router.add_get("/ready", router.ready)
    app.router.add_get("/metrics", router.metrics_route)
    app.router.add_get("/v1/pdx/stats", router.stats)
    return app
