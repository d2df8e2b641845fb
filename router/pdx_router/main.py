"""`pdx-router --config /etc/pdx/router.json` (the operator) or flags alone (local use)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import sys

from pydantic import ValidationError

from pdx_contract.base import problems
from pdx_contract.router_config import TenancyConfig

from . import NATIVE
from .app import build
from .config import ConfigError, RouterConfig, StoreConfig, load_config, with_overrides


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pdx-router", description=__doc__)
    p.add_argument("--config", help="JSON config rendered by the operator")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--prefill", action="append", help="prefill base URL (repeatable)")
    p.add_argument("--decode", action="append", help="decode base URL (repeatable)")
    p.add_argument("--model", help="served model name")
    p.add_argument("--generation")
    p.add_argument("--conversation-ttl", type=float, help="seconds an entry is reused")
    p.add_argument("--threshold", type=int, help="fewest tokens worth a remote read")
    p.add_argument("--redis-url", help="share entries through Redis")
    p.add_argument(
        "--tenancy",
        choices=("apiKey", "header", "single"),
        help="how tenants are told apart: the API key (default), a gateway's header, or one trusted client",
    )
    p.add_argument("--tenant-header", help="with --tenancy header: the header a trusted gateway sets")
    p.add_argument(
        "--reuse-headers", action="store_true", default=None, help="answer with X-PDX-* reuse facts (trusted clients)"
    )
    p.add_argument(
        "--conversation-from",
        choices=("id", "history", "both"),
        help="find a turn's conversation by its id, by its messages' history, or both (default: an id when sent)",
    )
    p.add_argument(
        "--decode-local-max-tokens",
        type=int,
        help="prefill a follow-up turn with at most this many new tokens on the decode holding it (0: never)",
    )
    p.add_argument("--decode-local-max-busy", type=int, help="...only while that decode has fewer in flight")
    p.add_argument(
        "--decode-local-idle-max-tokens", type=int, help="...and up to this many while it has nothing in flight"
    )
    p.add_argument(
        "--first-token-from-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stream a P/D turn's first token from prefill (decode needs pdx_engine.first_token)",
    )
    p.add_argument("--engine-api-key-file", help="file with the engines' API key (sent in place of the client's)")
    p.add_argument("--endpoints-file")
    p.add_argument("--tokenizer", help="model directory: tokenize reused chat turns here, not via /tokenize")
    p.add_argument("--header-timeout", type=float, help="seconds a client has to send a request's headers")
    p.add_argument("--body-timeout", type=float, help="seconds a client has to send a request's body")
    p.add_argument("--max-connections", type=int, help="open client connections above this are refused")
    p.add_argument(
        "--log-level",
        default=os.environ.get("PDX_ROUTER_LOG_LEVEL", "INFO"),
        help="INFO (default, or $PDX_ROUTER_LOG_LEVEL); DEBUG logs each hop's kv_transfer_params",
    )
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> RouterConfig:
    cfg = load_config(args.config) if args.config else RouterConfig()
    if args.conversation_ttl is not None and args.conversation_ttl <= 0:
        raise ConfigError("--conversation-ttl: must be > 0")
    if args.threshold is not None and args.threshold < 0:
        raise ConfigError("--threshold: must be >= 0")
    store = tenancy = None
    if args.tenancy is not None or args.tenant_header is not None:
        identity = args.tenancy or ("header" if args.tenant_header else cfg.tenancy.identity)
        try:
            tenancy = TenancyConfig(identity=identity, header=args.tenant_header)
        except ValidationError as err:
            raise ConfigError("; ".join(problems(err))) from None
    if args.redis_url is not None:
        store = StoreConfig(kind="redis", url=args.redis_url, key_prefix=cfg.store.key_prefix)
    return with_overrides(
        cfg,
        store=store,
        host=args.host,
        port=args.port,
        prefill=args.prefill,
        decode=args.decode,
        served_model_name=args.model,
        generation=args.generation,
        conversation_ttl_seconds=args.conversation_ttl,
        kv_recompute_threshold=args.threshold,
        tenancy=tenancy,
        reuse_headers=args.reuse_headers,
        conversation_from=args.conversation_from,
        decode_local_max_tokens=args.decode_local_max_tokens,
        decode_local_max_busy=args.decode_local_max_busy,
        decode_local_idle_max_tokens=args.decode_local_idle_max_tokens,
        first_token_from_prefill=args.first_token_from_prefill,
        engine_api_key_file=args.engine_api_key_file,
        endpoints_file=args.endpoints_file,
        tokenizer=args.tokenizer,
        header_timeout_seconds=args.header_timeout,
        body_timeout_seconds=args.body_timeout,
        max_connections=args.max_connections,
    )


async def serve(cfg: RouterConfig) -> None:
    """Run until cancelled; a client that disconnects cancels its handler, which aborts upstream."""
    serving = build(cfg)
    await serving.start(cfg.host, cfg.port)
    # Everything allocated so far (modules, app, metrics: ~57k objects) lives forever. Left
    # in the collector's view, each full collection walked it all and stalled every stream
    # for ~15-20 ms here (seen in the benchmark at 32 conversations); frozen, it is skipped.
    gc.freeze()
    logging.getLogger("pdx_router").info("pdx-router listening on %s:%d; data path: %s", cfg.host, cfg.port, NATIVE)
    try:
        await asyncio.Event().wait()
    finally:
        await serving.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        print(f"pdx-router: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(cfg))
    except ConfigError as exc:  # a tokenizer directory that does not load
        print(f"pdx-router: bad config: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


if __name__ == "__main__":
    main()
