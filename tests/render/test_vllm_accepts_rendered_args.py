"""Real vLLM's own CLI parser accepts what pdx renders and builds the intended KV config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdx.local.podenv import command_line, resolve_env
from pdx.render import render
from pdx.render.engines import ENGINE_ENTRYPOINT, decode_graph_size, graph_args
from pdx.resource import load

pytest.importorskip("vllm", reason="needs the engine extra (scripts/setup.sh)")
from tests.support.vllm_cli import VllmArgsError, parse_serve_args

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
FIELDS = {"metadata.name": "demo-decode-0", "metadata.uid": "7f1e", "status.podIP": "10.1.2.3"}


def engine_argv(path: Path, role: str) -> tuple[list[str], dict[str, str]]:
    objects = render(load(yaml.safe_load(path.read_text())))
    sts = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["labels"]["pdx.dev/role"] == role)
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    env = resolve_env(container, FIELDS)
    words = command_line(container, env)
    assert words[:3] == [ENGINE_ENTRYPOINT, "vllm", "serve"]
    return words[3:], env


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_vllm_parses_rendered_serve_args_into_its_own_config_objects(path: Path, role: str) -> None:
    argv, env = engine_argv(path, role)
    engine_args, kv = parse_serve_args(argv)
    target = load(yaml.safe_load(path.read_text()))
    spec = target.spec
    assert kv.kv_connector == "NixlConnector"
    assert kv.kv_role == ("kv_producer" if role == "prefill" else "kv_consumer")
    # vLLM's own per-process id: a restarted container is a new NIXL peer (see kv_transfer_config)
    assert kv.engine_id is not None and kv.engine_id != parse_serve_args(argv)[1].engine_id
    extra = kv.kv_connector_extra_config
    assert extra["decoder_kv_blocks_ttl"] == spec.kv_transfer.decoder_kv_blocks_ttl_seconds
    assert extra["kv_recompute_threshold"] == spec.kv_transfer.kv_recompute_threshold
    assert extra["bidirectional_kv_xfer"] is spec.kv_transfer.bidirectional
    # read as NixlConnector reads it (nixl/base_scheduler.py, base_worker.py: default 30)
    lease = kv.get_from_extra_config("kv_lease_duration", 30)
    assert lease == spec.kv_transfer.kv_lease_duration_seconds
    assert lease // 6 >= 1 and lease * 2 // 3 > lease // 6  # heartbeats at least 1 s apart, each renewing past the next
    assert engine_args.tensor_parallel_size == spec.role(role).tensor_parallel_size  # type: ignore[arg-type]
    assert engine_args.enable_prefix_caching is spec.prefix_caching(role)  # type: ignore[arg-type]
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"
    if role == "decode" and graph_args(target, "decode"):  # graphs large enough for a decode-local turn
        assert engine_args.compilation_config.max_cudagraph_capture_size == decode_graph_size(target)


def test_the_seed_articles_0_29_keys_would_be_rejected() -> None:
    argv, _ = engine_argv(ROOT / "examples" / "seed-qwen3-32b-1p1d.yaml", "prefill")
    i = argv.index("--kv-transfer-config") + 1
    argv[i] = argv[i].replace('"kv_connector":', '"kv_rank":0,"kv_parallel_size":2,"kv_connector":')
    with pytest.raises(VllmArgsError):
        parse_serve_args(argv)


def test_the_lease_arithmetic_pdx_bounds_by_is_the_installed_vllms() -> None:
    """MIN_KV_LEASE_SECONDS and the field's description assume these two lines of NixlConnector."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_scheduler, base_worker

    from pdx.spec import KV_LEASE_HEARTBEATS, MIN_KV_LEASE_SECONDS

    scheduler = inspect.getsource(base_scheduler.NixlBaseConnectorScheduler.__init__)
    worker = inspect.getsource(base_worker)
    assert f"self._heartbeat_interval = self._kv_lease_duration // {KV_LEASE_HEARTBEATS}" in scheduler  # decode
    assert "self._lease_extension = kv_lease_duration * 2 // 3" in worker  # prefill, per heartbeat
    assert MIN_KV_LEASE_SECONDS // KV_LEASE_HEARTBEATS == 1
