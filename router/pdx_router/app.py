"""The HTTP server: OpenAI front, the prefill -> decode flow, retry without reuse.

Every decision comes from the policy package; this module only moves bytes, measures and
records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import orjson
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pdx_contract import headers as hdr
from pdx_contract import kv_prefix
from pdx_contract.holds import HoldsAnswer
from pdx_contract.stats import Holding

from . import answer
from .answer import StreamedAnswer, StreamedText
from .chat_tokens import ChatTokenizer, TextPrefix
from .claim_gate import ClaimGate
from .claims import ClaimDrops, holds_call
from .config import ConfigError, RouterConfig
from .discovery import Discovery, Pool
from .endpoints import Endpoint
from .entries import Captured, Entry
from .errors import ClientFacingError, EngineTimeout, MalformedAnswer, NoEngines, UpstreamError
from .filters import StreamFilter, filter_response, well_formed_kv
from .front import Answer, Request, Routes, Server, Stream, error_body, json_answer
from .ids import IdText, of_list
from .metrics import Metrics, held_kv_counts
from .policy import Outcome, engines, first_token, holds, local, retry, reuse, shapes
from .policy.holds import Claim
from .policy.retry import Attempt, Hop, Retry
from .policy.reuse import IdsSource, PromptIds, TurnPlan
from .policy.shapes import ClientRequest
from .policy.trust import TokenizerTrust
from .relay import StreamRelay
from .store import MemoryStore, RedisStore, Store
from .upstream import (
    Upstream,
    check_status,
    json_object,
    tokenized_ids,
)

log: Final = logging.getLogger("pdx_router")


def make_store(cfg: RouterConfig) -> Store:
    if cfg.store.kind == "redis":
        assert cfg.store.url is not None
        return RedisStore(
            cfg.store.url, cfg.store.key_prefix, cfg.max_entries, cfg.store.max_bytes, cfg.store.tenant_bytes()
        )
    return MemoryStore(cfg.max_entries, cfg.store.max_bytes, cfg.store.tenant_bytes())


@dataclass(frozen=True)
class Prefilled:
    """What happened up to decode: the try that got through prefill, and how long it took.
    The relay, the log line and the store read it."""

    attempt: Attempt  # its outcome is the turn's
    prefill_ms: float
    started: float  # perf_counter() when the request arrived
    router_ms: float = 0.0  # arrival to the serving try's first hop: planning, the claim gate, the claim


Pinned = tuple[Endpoint, str]  # a decode, and the hold on it the router claimed (policy.holds)


@dataclass
class Opened:
    """A streamed turn whose answer began with prefill's token (policy.first_token): the
    client's stream, the token, and what decode must not send again."""

    out: Stream
    first: first_token.First
    cut: first_token.Cut


@dataclass(frozen=True)
class Claimed:
    """A try after its claim on decode's held KV, and the claim to drop once prefill answered."""

    attempt: Attempt
    pinned: Pinned | None  # when decode pinned the hold


class Router:
    def __init__(self, cfg: RouterConfig, store: Store | None = None) -> None:
        self.cfg = cfg
        self.drops = ClaimDrops(self._send_drops)
        self.claim_gate = ClaimGate(cfg.claim_queue_tokens)
        self.chat_tokens = ChatTokenizer.from_dir(cfg.tokenizer) if cfg.tokenizer else None
        self.trust = TokenizerTrust()
        self.pool = Pool()
        self.upstream = Upstream(cfg.upstream_timeout_seconds)
        self.store = store if store is not None else make_store(cfg)
        self.metrics = Metrics()
        self.metrics.watch_decodes(lambda: self.pool.endpoints)
        self.discovery = Discovery(cfg, self.pool, self.upstream)
        self.local_rule = local.Rule(
            cfg.decode_local_max_tokens, cfg.decode_local_max_busy, cfg.decode_local_idle_max_tokens
        )
        self.front = shapes.Front(
            cfg.tenancy,
            cfg.served_model_name,
            engine_key(cfg.engine_api_key_file),
            cfg.conversation_from,
            keep_history=self.local_rule.max_tokens > 0,
            prefill_affinity=cfg.prefill_affinity,
        )

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.upstream.start()
        await self.discovery.start()

    async def stop(self) -> None:
        await self.discovery.stop()
        await self.upstream.close()
        await self.store.close()

    # ------------------------------------------------------------ small routes

    async def health(self, _req: Request) -> Answer:
        return json_answer({"status": "ok"})

    async def ready(self, _req: Request) -> Answer:
        gen = engines.choose_generation(self.pool.endpoints, self.cfg.generation)
        if gen is None:
            return json_answer({"ready": False, "reason": "no healthy P/D pair"}, status=503)
        return json_answer({"ready": True, "generation": gen})

    async def models(self, _req: Request) -> Answer:
        model = {"id": self.cfg.served_model_name, "object": "model", "owned_by": "pdx"}
        return json_answer({"object": "list", "data": [model]})

    async def metrics_route(self, _req: Request) -> Answer:
        if (entries := await self._count()) is not None:
            self.metrics.entries.set(entries)
        # In a thread, so a scrape never stalls the streams (prometheus_client takes a lock per
        # metric and per value: the loop may count meanwhile).
        body = await asyncio.to_thread(generate_latest, self.metrics.registry)
        return Answer(200, body, CONTENT_TYPE_LATEST)

    async def holding(self, req: Request) -> Answer:
        """How many live entries of this config generation point at one decode: a decode being
        scaled away (pdx_engine.drain, its preStop) waits until none does. Entries of another
        generation are no use to the next turns, so a rollout never waits for them."""
        decode = req.query.get("decode")
        if not decode:
            return _error(400, "decode: the query needs the decode's URL, e.g. ?decode=http://10.0.0.5:8000", "")
        try:
            entries: int | None = await self.store.holding(decode, self.cfg.generation)
        except Exception as exc:
            self._store_failed("holding", exc)
            entries = None  # unknown: the decode's drain decides (it stops waiting)
        answer = Holding(decode=decode, generation=self.cfg.generation, entries=entries)
        return Answer(200, orjson.dumps(answer.to_json()))

    async def stats(self, _req: Request) -> Answer:
        entries = await self._count()  # None: the store is down (its errors are counted)
        stats = self.metrics.stats(
            entries or 0,
            self.trust.state if self.chat_tokens is not None else "off",
            held_kv_counts(self.pool.endpoints),
        )
        stats = stats.model_copy(update={"store_bytes": await self._nbytes() or 0})
        return Answer(200, orjson.dumps(stats.to_json()))

    # ------------------------------------------------------------ completions

    async def chat(self, req: Request) -> Answer | Stream:
        return await self._complete(req, "/v1/chat/completions", True)

    async def completions(self, req: Request) -> Answer | Stream:
        return await self._complete(req, "/v1/completions", False)

    async def _complete(self, req: Request, path: str, is_chat: bool) -> Answer | Stream:
        started = time.perf_counter()
        rid = shapes.request_id(req.headers.get("X-Request-ID"), os.urandom(16).hex())  # (as random as a uuid4)
        try:
            if req.complete:  # the body came with the head: nothing to wait for, no timer
                raw = await req.read()
            else:
                async with asyncio.timeout(self.cfg.body_timeout_seconds):  # (wait_for would start a task)
                    raw = await req.read()
            body = orjson.loads(raw)
        except TimeoutError:
            seconds = self.cfg.body_timeout_seconds
            # The rest of the body is unread: the connection carries no next request.
            return _error(408, f"request body not received within bodyTimeoutSeconds ({seconds:g} s)", rid, close=True)
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON", rid)
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", rid)
        try:
            ask = shapes.client_request(body, req.headers, path, is_chat, self.front, rid)
        except shapes.BadRequest as exc:
            return _error(400, str(exc), rid)
        try:
            try:
                return await self._serve(req, ask, started, len(raw))
            except NoEngines:
                # An engine may have come back since the last periodic check: look once now
                # rather than fail a client for up to a health-check interval.
                await self.discovery.check_all()
                return await self._serve(req, ask, started, len(raw))
        except NoEngines:
            return _error(503, "no healthy prefill/decode pair of one generation", rid)
        except ClientFacingError as exc:
            return Answer(exc.status, exc.body, exc.content_type, {"X-Request-ID": rid})
        # What went wrong inside goes to the log, with the engine's URL; the client learns the
        # role and a request id to quote, never an address or an engine's words.
        except MalformedAnswer as exc:  # counted by _after_failure
            log.warning("[%s] malformed answer: %s", rid, exc)
            return _error(502, f"the {exc.endpoint.role} engine's answer was malformed", rid)
        except EngineTimeout as exc:
            log.warning("[%s] engine timeout: %s (%s)", rid, exc, exc.endpoint.url)
            return _error(504, exc.message, rid)  # counted by _after_failure
        except UpstreamError as exc:
            log.warning("[%s] engine failed: %s", rid, exc)
            self.metrics.upstream_errors.labels(exc.endpoint.role).inc()
            return _error(502, f"the {exc.endpoint.role} engine failed", rid)

    def _generation(self) -> str:
        gen = engines.choose_generation(self.pool.endpoints, self.cfg.generation)
        if gen is None:
            raise NoEngines
        return gen

    async def _plan(self, ask: ClientRequest, gen: str, prefill: Endpoint) -> TurnPlan:
        """Take the conversation's entry and plan the turn on it (tokenizing only if needed)."""
        entry = await self._find(ask)
        now = time.time()
        if entry is not None:
            self.metrics.inter_turn_gap(now - entry.stored_at)
        blocked = reuse.check_entry(entry, now, self.pool.endpoints, gen)
        if blocked is not None or entry is None:
            return reuse.no_reuse(entry, blocked or Outcome.MISS)
        if entry.held_by_engines:
            return reuse.plan_checked_by_engines(entry)
        prompt = await self._prompt_ids(ask, entry, prefill)
        return reuse.plan_turn(entry, prompt, self.cfg.kv_recompute_threshold)

    async def _prompt_ids(self, ask: ClientRequest, entry: Entry, prefill: Endpoint) -> PromptIds:
        """The new prompt's ids from the first source that has them: the request itself, the
        router's tokenizer (trusted, resuming from the entry's head), else /tokenize."""
        if not ask.is_chat:  # a prompt of ids, read once already if it named its entry
            given = ask.prompt.ids if ask.prompt is not None else reuse.prompt_ids_of_completion(ask.body)
            if given is not None:
                return PromptIds(given, IdsSource.REQUEST)
        text = None
        if ask.is_chat and self.chat_tokens is not None and self.trust.trusted:
            text = self.chat_tokens.render(ask.body)
            held, held_n = entry.token_ids, entry.num_tokens
            if text is not None and (ids := self.chat_tokens.resume(text, entry.prefix, held, held_n)) is not None:
                self.metrics.prompt_ids_from(IdsSource.LOCAL)
                return PromptIds(ids, IdsSource.LOCAL, text)
        ids = await self._tokenize(prefill, ask, entry.token_ids)
        return PromptIds(ids, IdsSource.ENGINE if ids is not None else None, text)

    async def _tokenize(self, prefill: Endpoint, ask: ClientRequest, held: IdText) -> IdText | None:
        """The prompt's ids from the engine, rendered with the request's template arguments."""
        tok = shapes.tokenize_body(ask.body, ask.is_chat, ask.body.get("model"))
        if tok is None:
            return None
        try:
            _, raw = await self.upstream.post(prefill, "/tokenize", orjson.dumps(tok), ask.headers, total=True)
        except (UpstreamError, ClientFacingError) as exc:
            log.warning("tokenize failed, no reuse this turn: %s", exc)
            return None
        ids = tokenized_ids(raw, held)
        if ids is None:
            return None
        self.metrics.prompt_ids_from(IdsSource.ENGINE)
        return ids

    async def _serve(self, req: Request, ask: ClientRequest, started: float, size: int) -> Answer | Stream:
        gen = self._generation()
        prefill = engines.choose_prefill(self.pool.endpoints, gen, ask.affinity)
        assert prefill is not None
        plan = await self._plan(ask, gen, prefill) if ask.conversational else reuse.NO_CONVERSATION
        attempt = retry.first_attempt(plan)
        local_turn = await self._local_decode(ask, plan, gen)
        if local_turn is not None:
            holder, pinned = local_turn
            attempt = retry.local_attempt(plan)
            try:
                return await self._decode_local(req, ask, attempt, holder, started)
            except EngineTimeout:
                raise  # the turn's time is spent: 504
            except UpstreamError as exc:
                self.metrics.upstream_errors.labels(Hop.DECODE.value).inc()
                fallback = retry.after_local_failure(attempt, exc.status)
                if fallback.unreachable:
                    holder.healthy = False
                log.info("local turn failed on %s (%s); through prefill instead", holder.url, exc.status)
                attempt = fallback.attempt
            finally:
                if pinned is not None:
                    self._drop_claim(pinned, ask)
        # Prefill's token may begin the client's answer (policy.first_token): once it has, a
        # failure is told in the stream, and a retry starts decode with the same token.
        stitch = self.cfg.first_token_from_prefill and first_token.eligible(ask.body)
        opened: Opened | None = None
        # A turn that would claim a hold waits for its prefill first (claim_gate.py): unclaimed,
        # and asked again as the queue moves (decode may release the hold meanwhile).
        keeper, kv = holds.holder(self.pool.endpoints, attempt.plan.affinity), attempt.kv
        claims = attempt.reuse and holds.would_claim(kv, keeper)
        tokens = holds.prefill_tokens(size, attempt.reused_tokens)
        waited = time.perf_counter()
        slot = await self.claim_gate.enter(
            prefill.url, tokens, (lambda: holds.would_claim(kv, keeper)) if claims else False
        )
        if claims:
            self.metrics.claim_wait.observe(time.perf_counter() - waited)
        try:
            claimed = await self._claim(attempt, ask) if attempt.reuse else None
            if claimed is not None:
                attempt = claimed.attempt
            while True:
                if attempt.retried:
                    gen = self._generation()
                    prefill = engines.choose_prefill(self.pool.endpoints, gen, ask.affinity) or prefill
                pinned, claimed = (claimed.pinned if claimed is not None else None), None
                decode = engines.choose_decode(self.pool.endpoints, gen, attempt.affinity)
                if decode is None:
                    if pinned is not None:
                        self._drop_claim(pinned, ask)
                    if opened is not None:
                        return self._end_opened(opened, ask, NoEngines())
                    raise NoEngines
                ppath, pbody = shapes.prefill_request(ask, attempt.kv, attempt.compared_ids, stitch and opened is None)
                _log_hop("to prefill", prefill, pbody.get("kv_transfer_params"))
                t0 = time.perf_counter()
                try:
                    pkv, panswer = await self._prefill_hop(prefill, ppath, ask, pbody, pinned)
                except UpstreamError as exc:
                    slot.leave()
                    again = self._after_failure(attempt, Hop.PREFILL, prefill, exc)
                    if again is None:
                        if opened is not None:
                            return self._end_opened(opened, ask, exc)
                        raise
                    attempt = again.attempt
                    continue
                slot.leave()  # its prefill has answered: the next waiting turn may claim
                attempt = retry.after_prefill(attempt, pkv if isinstance(pkv, dict) else None)
                done = Prefilled(attempt, (time.perf_counter() - t0) * 1000, started, (t0 - started) * 1000)
                self.metrics.prefill.observe(done.prefill_ms / 1000)
                if stitch and opened is None and (first := first_token.of_answer(panswer)) is not None:
                    opened = self._open(req, ask, done, first)
                dbody = shapes.decode_request(
                    ask,
                    pkv if isinstance(pkv, dict) else None,
                    attempt.compared_ids,
                    decode.names_held,
                    opened.first.token_id if opened is not None else None,
                )
                _log_hop("to decode", decode, dbody.get("kv_transfer_params"))
                try:
                    return await self._decode(req, ask, done, decode, dbody, opened)
                except ClientFacingError as exc:
                    if opened is None:
                        raise
                    return self._end_opened(opened, ask, exc)
                except UpstreamError as exc:
                    again = self._after_failure(attempt, Hop.DECODE, decode, exc)
                    if again is None:
                        if opened is not None:
                            return self._end_opened(opened, ask, exc)
                        raise
                    attempt = again.attempt
        finally:
            slot.leave()

    async def _prefill_hop(
        self, prefill: Endpoint, path: str, ask: ClientRequest, body: dict[str, Any], pinned: Pinned | None
    ) -> tuple[Any, dict[str, Any]]:
        """Prefill's answer's kv_transfer_params, and the answer; the claim on the hold it read is dropped once
        prefill has answered (or never will): its read, if any, is over. Dropped even after a
        read, which should free the hold claim and all: a read's notice that decode's worker
        does not take (vLLM logs "unrecognized request") would leave it pinned by the claim."""
        pkv: Any = None
        try:
            answer = await self._call(prefill, path, ask, body)
            pkv = answer.get("kv_transfer_params")
            if pkv is not None and not well_formed_kv(pkv):
                pkv = None
                raise MalformedAnswer(prefill, 200, "kv_transfer_params of the wrong shape")
            return pkv, answer
        finally:
            if pinned is not None:
                self._drop_claim(pinned, ask)

    async def _claim(self, attempt: Attempt, ask: ClientRequest) -> Claimed | None:
        """Pin the held KV this try reads on the decode that holds it (policy.holds)."""
        decode = holds.holder(self.pool.endpoints, attempt.plan.affinity)
        hold = holds.claimable(attempt.kv, decode)  # asked again: the gate's wait may have changed it
        if hold is None or decode is None:
            return None
        if holds.known_released(decode, hold):  # decode said so already: no call
            self.metrics.claim(Claim.GONE)
            return Claimed(holds.after_claim(attempt, Claim.GONE), None)
        claim, answer = await self._claim_hold(decode, hold, ask)
        if claim is Claim.UNREACHABLE:
            decode.healthy = False  # until its next health check, as after a failed hop
        pinned = (decode, hold) if claim is Claim.HELD else None
        kept = answer.kept.get(hold) if answer is not None else None
        expiry = answer.claim_expiry if answer is not None else None
        return Claimed(holds.after_claim(attempt, claim, kept, expiry), pinned)

    async def _claim_hold(self, decode: Endpoint, hold: str, ask: ClientRequest) -> tuple[Claim, HoldsAnswer | None]:
        """Claim `hold` on `decode` (with the drops waiting for it), count decode's answer, and stop
        asking a decode that has no route."""
        drops = self.drops.take(decode, ask.headers)
        status, answer = await holds_call(self.upstream, decode, [hold], drops, ask.headers)
        claim = holds.read(hold, status, answer)
        if claim is Claim.NO_VALVE and status in (404, 405):
            decode.claims = False  # no route: this engine runs no valve; stop asking it
        self.metrics.claim(claim)
        return claim, answer

    def _drop_claim(self, pinned: Pinned, ask: ClientRequest) -> None:
        """Let decode release the hold again, off the turn's path (`claims`: with the next
        claim to that decode, or alone shortly)."""
        decode, hold = pinned
        self.drops.add(decode, hold, ask.headers)

    async def _send_drops(self, decode: Endpoint, drops: list[str], headers: dict[str, str]) -> None:
        await holds_call(self.upstream, decode, [], drops, headers)

    async def _local_decode(
        self, ask: ClientRequest, plan: TurnPlan, gen: str
    ) -> tuple[Endpoint, Pinned | None] | None:
        """The decode to prefill this turn on, if `local.decide` says so (each turn it could
        have taken but did not is counted, by why), and the claim on its hold when it took one
        (`_claim_local`)."""
        rule = self.local_rule
        if rule.max_tokens <= 0 or plan.outcome is not Outcome.HIT:
            return None
        holder = engines.choose_decode(self.pool.endpoints, gen, plan.affinity)
        suffix = local.exact_suffix(plan)
        if suffix is None and ask.is_chat:
            messages = ask.body["messages"]
            tail = local.suffix_messages(messages, ask.history, plan.turn)
            if tail is not None:
                count = self.chat_tokens.count if self.chat_tokens is not None else None
                suffix = local.count_tokens(tail, count, rule.cap, local.sure_local(plan, holder, rule))
        why = local.decide(plan, suffix, holder, rule)
        if holder is not None and local.worth_a_fresh_look(suffix, holder, rule, time.monotonic()):
            await self.discovery.fresh_load(holder)
            why = local.decide(plan, suffix, holder, rule)
        pinned = None
        if why is local.Why.LOCAL and holder is not None and holds.pressed(holder, time.monotonic()):
            pinned, why = await self._claim_local(ask, plan, suffix, holder, rule)
        if why is not local.Why.LOCAL or holder is None:
            self.metrics.local_skipped(why)
            return None
        return holder, pinned

    async def _claim_local(
        self, ask: ClientRequest, plan: TurnPlan, suffix: int | None, holder: Endpoint, rule: local.Rule
    ) -> tuple[Pinned | None, local.Why]:
        """A local turn on a pressed decode (`holds.pressed`) claims its hold first and is decided
        again on the answer: a hold decode released goes through prefill as `released`, a
        shortened one as `local.decide` says with what decode kept; a held one is pinned until
        the turn ends, so that it is not given up between this answer and decode scheduling the
        turn. Without a hold to name, or a claim decode cannot answer, the turn goes as decided."""
        hold = holds.claimable(plan.kv, holder)
        if hold is None:
            return None, local.Why.LOCAL
        claim, _ = await self._claim_hold(holder, hold, ask)
        if claim is Claim.GONE and holder.released.get(hold) is not True:  # not superseded: its blocks may be gone
            return None, local.Why.RELEASED
        why = local.decide(plan, suffix, holder, rule)  # with what the answer said decode kept
        pinned = (holder, hold) if claim is Claim.HELD else None
        if pinned is not None and why is not local.Why.LOCAL:
            self._drop_claim(pinned, ask)
            pinned = None
        return pinned, why

    async def _decode_local(
        self, req: Request, ask: ClientRequest, attempt: Attempt, decode: Endpoint, started: float
    ) -> Answer | Stream:
        """The whole turn on the decode that holds the conversation: no prefill hop."""
        body = shapes.local_decode_request(ask, attempt.compared_ids, decode.names_held)
        _log_hop("to decode (local)", decode, body.get("kv_transfer_params"))
        done = Prefilled(attempt, 0.0, started, (time.perf_counter() - started) * 1000)
        return await self._decode(req, ask, done, decode, body)

    def _after_failure(self, attempt: Attempt, hop: Hop, ep: Endpoint, exc: UpstreamError) -> Retry | None:
        """Count the failure and apply retry's decision to the engine's health."""
        self.metrics.upstream_errors.labels(hop.value).inc()
        if isinstance(exc, EngineTimeout):
            return None  # the turn's time is spent: 504, and the engine is slow, not gone
        again = retry.after_failure(attempt, hop, exc.status)
        if again is not None:
            if again.unreachable:
                ep.healthy = False
            if hop is Hop.PREFILL and attempt.reuse:
                log.info("reuse declined by %s (%s); retrying without reuse", ep.url, exc.status)
        return again

    async def _call(self, ep: Endpoint, path: str, ask: ClientRequest, body: dict[str, Any]) -> dict[str, Any]:
        ep.outstanding += 1
        try:
            return await self.upstream.post_json(ep, path, body, ask.headers)
        except UpstreamError as exc:
            if exc.timed_out:
                raise EngineTimeout(ep, self.cfg.upstream_timeout_seconds) from exc
            raise
        finally:
            ep.outstanding -= 1

    def _answer_headers(self, ask: ClientRequest, done: Prefilled) -> dict[str, str]:
        """Reuse facts describe the stored entries, so they go only to a trusted client."""
        out = {"X-Request-ID": ask.request_id}
        if self.cfg.reuse_headers:
            out[hdr.PREFILL_MS] = f"{done.prefill_ms:.1f}"
            out[hdr.ROUTER_MS] = f"{done.router_ms:.1f}"
            out[hdr.REUSE] = done.attempt.outcome.value
            out[hdr.REUSED_TOKENS] = str(done.attempt.reused_tokens)
            out[hdr.FOUND_BY] = ask.found_by.value
        return out

    async def _decode(
        self,
        req: Request,
        ask: ClientRequest,
        done: Prefilled,
        decode: Endpoint,
        body: dict[str, Any],
        opened: Opened | None = None,
    ) -> Answer | Stream:
        decode.outstanding += 1
        out: Answer | Stream
        try:
            if ask.stream:
                out = await self._relay_stream(req, ask, done, decode, body, opened)
            else:
                out = await self._relay_json(ask, done, decode, body)
        except UpstreamError as exc:
            if exc.timed_out:
                raise EngineTimeout(decode, self.cfg.upstream_timeout_seconds) from exc
            raise
        finally:
            decode.outstanding -= 1
        self._finish(done)
        return out

    def _event_stream(self, req: Request, ask: ClientRequest, done: Prefilled) -> Stream:
        """The client's streamed answer, bound to its connection (its head leaves with the first write)."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        out = Stream(200, {**headers, **self._answer_headers(ask, done)})
        out.start(req)
        return out

    def _open(self, req: Request, ask: ClientRequest, done: Prefilled, first: first_token.First) -> Opened:
        """Begin the client's answer with prefill's token (policy.first_token), before decode's hop."""
        out = self._event_stream(req, ask, done)
        chunk_id = ("chatcmpl-" if ask.is_chat else "cmpl-") + ask.request_id
        out.write(first_token.opening(first, ask.is_chat, chunk_id, ask.body.get("model"), int(time.time())))
        self.metrics.ttft.observe(time.perf_counter() - done.started)
        return Opened(out, first, first_token.Cut(first, ask.is_chat))

    def _end_opened(self, opened: Opened, ask: ClientRequest, exc: Exception) -> Stream:
        """A turn whose answer began cannot be answered with a status any more: its stream says
        what failed, as for a decode stream that broke, with no [DONE]."""
        log.warning("[%s] turn failed after prefill's first token was sent: %r", ask.request_id, exc)
        if isinstance(exc, ClientFacingError):  # decode refused what prefill had taken
            err = error_body(exc.status, "the decode engine refused the request", ask.request_id)
        else:
            role = exc.endpoint.role if isinstance(exc, UpstreamError) else "decode"
            err = error_body(502, f"the {role} engine failed", ask.request_id)
        with contextlib.suppress(ConnectionResetError):
            opened.out.write(b"data: " + orjson.dumps(err) + b"\n\n")
            opened.out.end()
        return opened.out

    async def _relay_stream(
        self,
        req: Request,
        ask: ClientRequest,
        done: Prefilled,
        decode: Endpoint,
        body: dict[str, Any],
        opened: Opened | None = None,
    ) -> Stream:
        # Always filtered, even when nothing is captured or stripped: decode's
        # kv_transfer_params never reach a client (a block without them passes untouched).
        filt = StreamFilter(capture=ask.capture, strip_ids=not ask.wants_ids)
        filt.max_line_bytes = self.upstream.max_answer_bytes
        filt.stop_at_drop = True
        ttft = self.metrics.ttft
        limit = self.upstream.max_answer_bytes
        relay = StreamRelay(filt, limit, lambda: ttft.observe(time.perf_counter() - done.started))
        if opened is not None:
            relay.first = False  # the client's first token left with the opening
            relay.cut = opened.cut if not opened.cut.done else None
        if ask.capture and ask.history is not None:  # the answer names the entry, or the turn it holds
            relay.said = StreamedAnswer()
        elif ask.capture and ask.reads_text:  # the completion's text names the entry
            relay.said = StreamedText()
        call = relay.call = await self.upstream.stream(decode, ask.path, body, ask.headers, relay)
        try:
            await relay.wait()
            head = relay.head_
            if head is None:  # failed before the status line
                raise UpstreamError(decode, None, repr(relay.failed), relay.failed) from relay.failed
            if relay.error_body is not None:
                while not (relay.ended or relay.failed):
                    relay.release(None)
                    await relay.wait()
                if relay.failed:
                    raise UpstreamError(decode, None, repr(relay.failed), relay.failed) from relay.failed
                check_status(decode, head, b"".join(relay.error_body))
            # Each filter reads one form: an answer whose Content-Type is not the form the
            # request asked for is refused, never relayed through the other form's filter.
            if head.content_type != "text/event-stream":
                raise MalformedAnswer(decode, head.status, f"a {head.content_type} answer, not text/event-stream")
            out = opened.out if opened is not None else self._event_stream(req, ask, done)
            return await self._relay_events(ask, done, decode, relay, out)
        except (asyncio.CancelledError, ConnectionResetError):
            # The client left: its handler is cancelled, or a write finds its socket closing (it
            # read [DONE] from the relay's own write and closed before the end went out). Once its
            # answer had begun, the turn was served as decided and counts.
            if not relay.first:
                self._finish(done)
            raise
        finally:
            if not relay.ended:
                call.abort()  # the client left, or the stream is given up: decode aborts the request

    async def _relay_events(
        self, ask: ClientRequest, done: Prefilled, decode: Endpoint, relay: StreamRelay, out: Stream
    ) -> Stream:
        """The coroutine's part of the relay: whatever the callbacks held (see relay.py)."""
        filt = relay.filt
        while True:
            relay.release(out)
            await relay.wait()
            for block in relay.take():
                if not relay.stored and filt.captured.kv is not None:
                    # Before the client can see the end of the turn: an agent sends the next
                    # turn as soon as it has [DONE], and that turn must find this entry.
                    relay.stored = True
                    await self._store_entry(ask, done, decode, filt.captured, relay.answer())
                if filt.dropped:
                    return await self._end_malformed(out, filt, block, "a line that is not readable JSON", ask)
                if block:
                    out.write(block)
                    if relay.first and block.find(b"data:") >= 0:
                        relay.first = False
                        relay.on_first()
            if relay.client_gone:
                return out
            if relay.failed is not None:
                exc = relay.failed
                log.warning("[%s] decode stream from %s broke: %r", ask.request_id, decode.url, exc)
                self.metrics.upstream_errors.labels(Hop.DECODE.value).inc()
                filt.captured.kv = None  # incomplete turn: do not store
                # The status line has left: say so in the stream, as vLLM does for an error after
                # the first chunk, and no [DONE], so no client takes the cut answer for a whole one.
                what = "timed out (upstreamTimeoutSeconds)" if isinstance(exc, TimeoutError) else "broke off"
                err = error_body(502, f"the decode engine's stream {what}", ask.request_id)
                out.write(b"data: " + orjson.dumps(err) + b"\n\n")  # whole lines only were written
                out.end()
                return out
            if relay.ended:
                break
            await out.drain()  # a slow client: decode waits meanwhile
        if rest := filt.flush():
            if relay.said is not None:
                relay.said.feed(rest)
            if relay.cut is not None:
                rest = relay.cut.feed(rest)
            if not relay.stored and filt.captured.kv is not None:
                relay.stored = True
                await self._store_entry(ask, done, decode, filt.captured, relay.answer())
            out.write(rest)
        if filt.dropped or not relay.last.rstrip().endswith(b"[DONE]"):
            return await self._end_malformed(out, filt, b"", "it ended before [DONE]", ask)
        out.end()
        return out

    async def _end_malformed(
        self, out: Stream, filt: StreamFilter, block: bytes, why: str, ask: ClientRequest
    ) -> Stream:
        """Decode's stream cannot be relayed whole: what was readable, then an error event
        and no [DONE] (as for a broken stream); the turn is not stored."""
        self.metrics.upstream_errors.labels(Hop.DECODE.value).inc()
        filt.captured.kv = None
        if block:
            out.write(block)
        what = "a line above the size limit" if filt.oversized else why
        log.warning("[%s] decode's stream was malformed: %s", ask.request_id, what)
        err = error_body(502, f"the decode engine's stream was malformed: {what}", ask.request_id)
        out.write(b"data: " + orjson.dumps(err) + b"\n\n")
        out.end()
        return out

    async def _relay_json(self, ask: ClientRequest, done: Prefilled, decode: Endpoint, body: dict[str, Any]) -> Answer:
        head, raw = await self.upstream.post(decode, ask.path, orjson.dumps(body), ask.headers, total=False)
        if head.content_type != "application/json":
            raise MalformedAnswer(decode, head.status, f"a {head.content_type} answer, not application/json")
        data = json_object(decode, head.status, raw)
        cap = filter_response(data, ask.capture, strip_ids=not ask.wants_ids)
        self.metrics.ttft.observe(time.perf_counter() - done.started)
        said = answer.of_json(data) if ask.history is not None else None
        if ask.reads_text:
            said = answer.text_of_json(data)
        await self._store_entry(ask, done, decode, cap, said)  # the answer leaves after the handler returns
        headers = self._answer_headers(ask, done)
        return Answer(200, orjson.dumps(data), headers=headers)

    def _finish(self, done: Prefilled) -> None:
        """Record the turn and log the line the seed's data collection reads."""
        self.metrics.outcome(done.attempt.outcome, done.attempt.reused_tokens)
        log.info(
            "Prefill done in %.0fms reuse=%s reused_tokens=%d total=%.0fms router=%.0fms",
            done.prefill_ms,
            done.attempt.outcome.value,
            done.attempt.reused_tokens,
            (time.perf_counter() - done.started) * 1000,
            done.router_ms,
        )

    async def _store_entry(
        self, ask: ClientRequest, done: Prefilled, decode: Endpoint, cap: Captured, said: dict[str, Any] | None
    ) -> None:
        """Keep what decode holds for this conversation's next turn: under its id, else under
        its history with `said`, the answer, else under its prompt with the completion."""
        _log_hop("from decode", decode, cap.kv)
        if not ask.capture:
            return
        if cap.kv is not None:  # whether to ask this decode for token ids next time
            decode.names_held = kv_prefix.HELD in cap.kv
            if (note := holds.released_note(cap.kv)) is not None:
                decode.note_releases(note.released, note.seq, note.since, note.covered, note.kept)
        plan = done.attempt.plan
        kept = reuse.after_turn(cap, done.attempt.compared_ids, decode, time.time(), self.cfg.conversation_ttl_seconds)
        if kept.mismatch:
            self.metrics.tokenize_mismatched()
            source = "the router's tokenizer" if plan.local_ids else "/tokenize"
            log.warning("prompt ids from %s differ from those decode used; entry dropped", source)
            if plan.local_ids:
                self._distrust()
            return
        if kept.entry is not None:
            prefix = await self._prefix_for_next_turn(ask, plan.text, cap.prompt(done.attempt.compared_ids))
            keep = ask.keep(said, cap.output_ids)
            if ask.tenant is not None and keep is not None:  # a client without an identity shares nothing
                entry = replace(kept.entry, prefix=prefix, tenant=ask.tenant, turn=keep.turn)
                await self._put(keep.key, entry, keep.head, keep.length)

    async def _prefix_for_next_turn(
        self, ask: ClientRequest, text: str | None, prompt_ids: IdText | None
    ) -> TextPrefix | None:
        """Where the router's tokenizer can resume next turn; on probation, first check it
        tokenizes this whole prompt exactly as the engine did."""
        tok = self.chat_tokens
        if tok is None or self.trust.off or not ask.is_chat or not prompt_ids:
            return None
        text = text if text is not None else tok.render(ask.body)
        if text is None:
            return None
        if not self.trust.trusted:
            # A whole prompt, 8 times per process: off the event loop.
            if of_list(await asyncio.to_thread(tok.encode_in_thread, text)) != prompt_ids:
                self._distrust()
                return None
            # The state after the await: another turn may have changed it meanwhile.
            self.trust = self.trust.after_match()
            if self.trust.trusted:
                log.info("the router's tokenizer matched the engine on %d prompts: using it", self.trust.agreed)
        return tok.prefix_of(text, prompt_ids)

    def _distrust(self) -> None:
        if not self.trust.off:
            log.error("the router's tokenizer disagrees with the engine's: /tokenize from now on")
        self.trust = self.trust.after_mismatch()

    # A store outage must not fail requests: the turn goes on as plain P/D (no entry to
    # read) and is not kept; each failure is logged and counted (pdx_router_store_errors).

    async def _find(self, ask: ClientRequest) -> Entry | None:
        """Take the entry under the first of the turn's keys that holds one: its id's, or its
        history's, longest first, or those of its prompt's prefixes that its heads' indexes
        list (no key: a first turn, nothing to ask)."""
        keys = ask.lookup_keys()
        try:
            if not keys and ask.prompt is not None:
                keys = ask.prompt_keys(await self.store.lengths(ask.prompt_heads()))
            if not keys:
                return None
            entry = await (self.store.take(keys[0]) if len(keys) == 1 else self.store.take_first(keys))
        except Exception as exc:
            self._store_failed("take", exc)
            return None
        if entry is not None:
            self.metrics.found(ask.found_by)
        return entry

    async def _put(self, key: str, entry: Entry, head: str | None = None, length: int = 0) -> None:
        try:
            await self.store.put(key, entry, head, length)
        except Exception as exc:
            self._store_failed("put", exc)

    async def _count(self) -> int | None:
        try:
            return await self.store.count()
        except Exception as exc:
            self._store_failed("count", exc)
            return None

    async def _nbytes(self) -> int | None:
        if not isinstance(self.store, MemoryStore | RedisStore):
            return None  # another store (a test's): nothing to tell
        try:
            return await self.store.nbytes()
        except Exception as exc:
            self._store_failed("count", exc)
            return None

    def _store_failed(self, op: str, exc: Exception) -> None:
        self.metrics.store_errors.labels(op).inc()
        log.warning("store.%s failed, the turn goes on without the store: %r", op, exc)


def _log_hop(what: str, ep: Endpoint, kv: Any) -> None:
    """`--log-level debug`: the exact kv_transfer_params of every hop, one line each."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s %s kv_transfer_params=%s", what, ep.url, orjson.dumps(kv).decode())


def _error(status: int, message: str, request_id: str, close: bool = False) -> Answer:
    body = orjson.dumps(error_body(status, message, request_id))
    return Answer(status, body, headers={"X-Request-ID": request_id}, close=close)


def engine_key(path: str | None) -> str | None:
    """The engines' API key from its mounted Secret file (read once: a rotated key needs a
    router restart, as vLLM's --api-key does)."""
    if path is None:
        return None
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"engineApiKeyFile: cannot read {path}: {exc.strerror}") from None
    if not key:
        raise ConfigError(f"engineApiKeyFile: {path} is empty; put the engines' API key in it")
    return key


@dataclass
class Serving:
    """A router and the server in front of it, started and stopped together."""

    router: Router
    server: Server

    async def start(self, host: str, port: int) -> int:
        """The port it listens on (0: one the OS picks)."""
        await self.router.start()
        return await self.server.start(host, port)

    async def close(self) -> None:
        await self.server.close()
        await self.router.stop()


def build(cfg: RouterConfig, store: Store | None = None) -> Serving:
    router = Router(cfg, store)
    routes = Routes()
    routes.add("POST", "/v1/chat/completions", router.chat)
    routes.add("POST", "/v1/completions", router.completions)
    routes.add("GET", "/v1/models", router.models)
    routes.add("GET", "/health", router.health)
    routes.add("GET", "/ready", router.ready)
    routes.add("GET", "/metrics", router.metrics_route)
    routes.add("GET", "/v1/pdx/stats", router.stats)
    routes.add("GET", "/v1/pdx/holding", router.holding)
    server = Server(routes, router.metrics, cfg.max_connections, cfg.header_timeout_seconds, cfg.max_request_bytes)
    return Serving(router, server)
