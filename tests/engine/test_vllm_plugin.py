"""The stream plugin puts decode's kv_transfer_params on the terminal streamed chunk, only where missing."""

from __future__ import annotations

import json
import types
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from pdx_engine import vllm_plugin

PARAMS = {"do_remote_decode": True, "remote_engine_id": "decode-0", "remote_num_tokens": 881}


@dataclass
class Output:
    finished: bool
    kv_transfer_params: dict[str, Any] | None


def chunk(finish: str | None) -> str:
    return (
        "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": finish}]}) + "\n\n"
    )


class FakeServing:
    async def chat_completion_stream_generator(
        self, request: Any, result_generator: AsyncIterator[Output]
    ) -> AsyncIterator[str]:
        async for out in result_generator:
            yield chunk("length" if out.finished else None)
        yield "data: [DONE]\n\n"


async def outputs() -> AsyncIterator[Output]:
    yield Output(False, None)
    yield Output(True, PARAMS)


async def test_the_finish_chunk_carries_the_params_and_no_other_chunk_does() -> None:
    wrapped = vllm_plugin._wrap_stream_generator(FakeServing.chat_completion_stream_generator, indexed=False)
    chunks = [c async for c in wrapped(FakeServing(), types.SimpleNamespace(n=1), outputs())]
    bodies = [json.loads(c[6:]) for c in chunks if c.startswith("data: {")]
    assert [b.get("kv_transfer_params") for b in bodies] == [None, PARAMS]
    assert chunks[-1] == "data: [DONE]\n\n"


def test_inject_leaves_chunks_without_finish_reason_alone() -> None:
    pending = {0: PARAMS}
    assert vllm_plugin._inject(chunk(None), pending, 1) == chunk(None)
    assert pending == {0: PARAMS}
    assert json.loads(vllm_plugin._inject(chunk("stop"), pending, 1)[6:])["kv_transfer_params"] == PARAMS
    assert pending == {}


def test_a_vllm_that_already_streams_the_params_is_not_patched() -> None:
    class ChatCompletionStreamResponse:
        model_fields: ClassVar[dict[str, Any]] = {"kv_transfer_params": None}

    class OpenAIServingChat(FakeServing):
        pass

    module = types.ModuleType("vllm.entrypoints.openai.chat_completion.serving")
    module.ChatCompletionStreamResponse = ChatCompletionStreamResponse  # type: ignore[attr-defined]
    module.OpenAIServingChat = OpenAIServingChat  # type: ignore[attr-defined]
    assert vllm_plugin.patch_module(module) is False
    del ChatCompletionStreamResponse.model_fields["kv_transfer_params"]
    assert vllm_plugin.patch_module(module) is True
    assert vllm_plugin.patch_module(module) is False  # once only
