"""vLLM general plugin: ``kv_transfer_params`` on the final streamed chunk.

With bidirectional KV transfer the router needs decode's ``kv_transfer_params`` (where decode
keeps the finished turn's KV) after every turn. vLLM 0.32 returns them only in non-streamed
responses; later versions add a ``kv_transfer_params`` field to the streamed chunk models and
fill it on the last chunk. Where the installed chunk models lack that field, this plugin wraps
the chat and completion stream generators: it watches the engine outputs they consume and adds
the finished request's ``kv_transfer_params`` to the chunk that carries ``finish_reason``.
Where the field exists it does nothing.

The patch is applied when the OpenAI serving modules are imported (`import_hook`).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

from pdx_engine.import_hook import module_exists, on_import

# Under "vllm." so that vLLM's own logging configuration prints it.
logger = logging.getLogger("vllm.pdx_plugin")

_MARK = "_pdx_stream_kv_params"


def _stream_chunk_has_field(serving: ModuleType, model_name: str) -> bool:
    """Whether the installed stream chunk model already declares ``kv_transfer_params``."""
    model = getattr(serving, model_name, None)
    fields = getattr(model, "model_fields", None)
    return isinstance(fields, dict) and "kv_transfer_params" in fields


def _inject(chunk: str, pending: dict[int, dict[str, Any]], num_choices: int) -> str:
    """Add a finished prompt's params to ``chunk`` if it is that prompt's terminal chunk."""
    if not chunk.startswith("data: {") or '"finish_reason"' not in chunk:
        return chunk
    try:
        body = json.loads(chunk[len("data: ") :])
    except ValueError:
        return chunk
    for choice in body.get("choices") or ():
        if choice.get("finish_reason") is None:
            continue
        params = pending.pop(int(choice.get("index", 0)) // num_choices, None)
        if params is not None:
            body["kv_transfer_params"] = params
            return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
    return chunk


def _wrap_stream_generator(
    original: Callable[..., AsyncIterator[str]], indexed: bool
) -> Callable[..., AsyncIterator[str]]:
    """Wrap a serving class's stream generator method.

    ``indexed``: the engine outputs arrive as ``(prompt_index, RequestOutput)`` (completions)
    rather than bare ``RequestOutput`` (chat).
    """
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[str]:
        bound = signature.bind(*args, **kwargs)
        request = bound.arguments["request"]
        num_choices = getattr(request, "n", None) or 1
        pending: dict[int, dict[str, Any]] = {}
        results = bound.arguments["result_generator"]

        async def watched() -> AsyncIterator[Any]:
            async for item in results:
                prompt_idx, res = item if indexed else (0, item)
                params = getattr(res, "kv_transfer_params", None)
                if getattr(res, "finished", False) and params is not None:
                    pending[prompt_idx] = params
                yield item

        bound.arguments["result_generator"] = watched()
        async for chunk in original(*bound.args, **bound.kwargs):
            yield _inject(chunk, pending, num_choices) if pending else chunk

    setattr(wrapper, _MARK, True)
    return wrapper


# module -> (class name, method name, chunk model name, outputs indexed by prompt)
_TARGETS: dict[str, tuple[str, str, str, bool]] = {
    "vllm.entrypoints.openai.chat_completion.serving": (
        "OpenAIServingChat",
        "chat_completion_stream_generator",
        "ChatCompletionStreamResponse",
        False,
    ),
    "vllm.entrypoints.openai.completion.serving": (
        "OpenAIServingCompletion",
        "completion_stream_generator",
        "CompletionStreamResponse",
        True,
    ),
}


def patch_module(module: ModuleType) -> bool:
    """Patch the serving class in ``module`` if needed; True if it was patched now."""
    class_name, method_name, chunk_model, indexed = _TARGETS[module.__name__]
    cls = getattr(module, class_name, None)
    method = getattr(cls, method_name, None)
    if cls is None or method is None:
        logger.error("pdx plugin: %s.%s not found; its streams lack kv_transfer_params", class_name, method_name)
        return False
    if getattr(method, _MARK, False) or _stream_chunk_has_field(module, chunk_model):
        return False
    setattr(cls, method_name, _wrap_stream_generator(method, indexed))
    logger.info("pdx plugin: %s streams kv_transfer_params on its final chunk", class_name)
    return True


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; safe to call repeatedly."""
    for name in _TARGETS:
        if not module_exists(name):
            logger.error("pdx plugin: this vLLM has no %s; its streams lack kv_transfer_params", name)
            continue
        on_import(name, patch_module)
