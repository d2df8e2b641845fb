"""A pdx plugin whose target this vLLM lacks says so when it loads; it never waits in silence."""

from __future__ import annotations

import logging
import types

import pytest

from pdx_engine import block_order, import_hook, prefix_check, vllm_plugin


def test_modules_are_found_without_importing_them() -> None:
    assert import_hook.module_exists("pdx_engine.drain")
    assert not import_hook.module_exists("pdx_engine.no_such_module")
    assert not import_hook.module_exists("no_such_package.module")


def test_a_missing_connector_module_is_logged_as_an_error_at_registration(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prefix_check, "MODULE", "vllm.no_such_connector")
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        prefix_check.register()
    assert "this vLLM has no vllm.no_such_connector; the engines' prefix check is OFF" in caplog.text


def test_a_connector_module_without_the_class_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        assert not prefix_check.patch_module(types.ModuleType(prefix_check.MODULE))
    assert "has no NixlBaseConnector; the engines' prefix check is OFF" in caplog.text


def test_a_serving_class_without_the_stream_method_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    name = next(iter(vllm_plugin._TARGETS))
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        assert not vllm_plugin.patch_module(types.ModuleType(name))
    assert "not found; its streams lack kv_transfer_params" in caplog.text


def test_a_block_pool_module_without_the_pool_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="vllm.pdx_plugin"):
        block_order.patch_module(types.ModuleType(block_order.MODULE))
    assert "has no BlockPool.get_new_blocks; KV blocks keep vLLM's order" in caplog.text
