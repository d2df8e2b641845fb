"""vLLM general plugin: the engines check that reused KV is for the prompt's own tokens.

vLLM's NixlConnector trusts the `remote_num_tokens` it is sent for a D->P read. With this
plugin (both roles, the scheduler's connector; `pdx_contract.kv_prefix` holds the protocol):

- decode's final `kv_transfer_params` carry a digest chain of the tokens it holds and
  `remote_num_tokens: 0`, so a prefill without the plugin reads nothing;
- prefill, given such parameters, reads only the blocks whose digests match its own prompt's
  (the last prompt token always computed, nothing below `kv_recompute_threshold`) and reports
  what it found in its answer's `kv_transfer_params`.

The router then reuses without asking anyone for token ids. Parameters without a held prefix
(a router that checked the prefix itself) are left as vLLM reads them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pdx_contract import kv_prefix
from pdx_engine.import_hook import module_exists, on_import

logger = logging.getLogger("vllm.pdx_plugin")

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector"
_MARK = "_pdx_prefix_check"


def _scheduler(connector: Any) -> Any:
    return getattr(connector, "connector_scheduler", None)


def _wrap_matched(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_num_new_matched_tokens(self: Any, request: Any, num_computed_tokens: int) -> Any:
        params = request.kv_transfer_params
        sched = _scheduler(self)
        if isinstance(params, dict) and params.get("do_remote_decode") and sched is not None:
            kv_prefix.check_params(
                params,
                list(request.prompt_token_ids or ()),
                int(sched.kv_recompute_threshold),
                getattr(request, "cache_salt", None),
            )
        return original(self, request, num_computed_tokens)

    return get_num_new_matched_tokens


def _wrap_finished(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
        delay, out = original(self, request, block_ids)
        sched = _scheduler(self)
        if isinstance(out, dict) and sched is not None:
            if out.get("do_remote_decode"):  # decode's params for the next turn
                kv_prefix.hold_params(
                    out, request.all_token_ids, int(sched.block_size), getattr(request, "cache_salt", None)
                )
            params = request.kv_transfer_params
            done = params.get(kv_prefix.CHECKED) if isinstance(params, dict) else None
            if done is not None:  # prefill's answer: what its check found
                out[kv_prefix.VERDICT] = done
        return delay, out

    return request_finished


def patch_module(module: ModuleType) -> bool:
    """Wrap the NIXL connector's scheduler-side calls; True if patched now."""
    cls = getattr(module, "NixlBaseConnector", None)
    if cls is None:
        logger.error("pdx plugin: %s has no NixlBaseConnector; the engines' prefix check is OFF", MODULE)
        return False
    if getattr(cls, _MARK, False):
        return False
    cls.get_num_new_matched_tokens = _wrap_matched(cls.get_num_new_matched_tokens)
    cls.request_finished = _wrap_finished(cls.request_finished)
    cls.request_finished_all_groups = _wrap_finished(cls.request_finished_all_groups)
    setattr(cls, _MARK, True)
    logger.info("pdx plugin: NIXL reads of decode's KV check the prompt's tokens")
    return True


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; safe to call repeatedly."""
    if not module_exists(MODULE):
        logger.error("pdx plugin: this vLLM has no %s; the engines' prefix check is OFF", MODULE)
        return
    on_import(MODULE, patch_module)
