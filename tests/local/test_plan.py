"""The local plan runs the rendered containers as they are, with only the pod's surroundings swapped."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pdx.local import default_document
from pdx.local.plan import LOOPBACK, VLLM_SERVE_LOCAL, Layout
from pdx.local.topology import LocalTopology
from pdx.render import render
from pdx.resource import load


def plan(tmp_path: Path, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    topo = LocalTopology(doc or default_document(), state_dir=tmp_path)
    return {p.name: p for p in topo.plan()}


def rendered_args(doc: dict[str, Any], role: str) -> list[str]:
    sts = next(o for o in render(load(doc)) if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(role))
    return list(sts["spec"]["template"]["spec"]["containers"][0]["args"])


def test_engines_run_the_rendered_arguments_through_the_vllm_serve_shim(tmp_path: Path) -> None:
    procs = plan(tmp_path)
    prefill = procs["local-prefill-0"]
    assert prefill.argv[: len(VLLM_SERVE_LOCAL)] == VLLM_SERVE_LOCAL
    rendered = rendered_args(default_document(), "prefill")[2:]  # after `vllm serve`
    local = prefill.argv[len(VLLM_SERVE_LOCAL) :]
    assert len(local) == len(rendered)
    changed = {(r, m) for r, m in zip(rendered, local, strict=True) if r != m}
    # Only the pod's surroundings differ: model path (volume), host/port.
    assert {r for r, _ in changed} == {"/models/pdx-tiny", "$(PDX_HTTP_HOST)", "$(PDX_HTTP_PORT)"}


def test_a_changed_rendered_argument_shows_up_in_the_local_run(tmp_path: Path) -> None:
    doc = copy.deepcopy(default_document())
    doc["spec"]["kvTransfer"]["kvRecomputeThreshold"] = 300
    doc["spec"]["decode"]["extraArgs"] = ["--max-num-batched-tokens", "4096"]
    procs = plan(tmp_path, doc)
    decode = procs["local-decode-0"].argv
    kv = json.loads(decode[decode.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"]["kv_recompute_threshold"] == 300
    assert decode[-2:] == ["--max-num-batched-tokens", "4096"]
    assert "--max-num-batched-tokens" not in procs["local-prefill-0"].argv


def test_pods_get_loopback_distinct_ports_and_leave_engine_ids_to_vllm(tmp_path: Path) -> None:
    doc = copy.deepcopy(default_document())
    doc["spec"]["decode"]["replicas"] = 2
    procs = plan(tmp_path, doc)
    engines = [p for p in procs.values() if p.role != "router"]
    assert len(engines) == 3
    ports = [p.port for p in engines] + [int(p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for p in engines]
    assert len(set(ports)) == len(ports)
    # vLLM draws one per process: every start, restarts included, is a new NIXL peer
    assert not any("engine_id" in json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1]) for p in engines)
    for p in engines:
        assert p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == LOOPBACK
        assert p.argv[p.argv.index("--host") + 1] == LOOPBACK
        assert p.env["HF_HUB_OFFLINE"] == "1"


def test_router_reads_its_rendered_config_with_loopback_endpoints_of_one_generation(tmp_path: Path) -> None:
    procs = plan(tmp_path)
    router = procs["local-router-0"]
    config_path = router.argv[router.argv.index("--config") + 1]
    config = json.loads(router.files[config_path])
    assert (config["host"], config["port"], config["dns"]) == (LOOPBACK, router.port, None)
    assert config["kvRecomputeThreshold"] == 64 and config["conversationTtlSeconds"] == 450
    endpoints = json.loads(router.files[config["endpointsFile"]])["endpoints"]
    assert {e["role"] for e in endpoints} == {"prefill", "decode"}
    assert {e["generation"] for e in endpoints} == {config["generation"]}
    assert {e["url"] for e in endpoints} == {procs[e["name"]].url for e in endpoints}


def test_a_router_field_changed_replans_only_the_router_on_its_port_before_the_same_engines(tmp_path: Path) -> None:
    import pytest

    from pdx.local.topology import TopologyError

    topo = LocalTopology(default_document(), state_dir=tmp_path)
    topo.processes = topo.plan()
    before = topo.by_role("router")[0]
    doc = copy.deepcopy(default_document())
    doc["spec"]["router"]["conversationFrom"] = "id"
    router = topo.router_for(doc)
    assert (router.name, router.port, router.argv) == (before.name, before.port, before.argv)
    config_path = router.argv[router.argv.index("--config") + 1]
    old, new = json.loads(before.files[config_path]), json.loads(router.files[config_path])
    assert {k for k in new if new[k] != old.get(k)} == {"conversationFrom"}
    assert router.files[new["endpointsFile"]] == before.files[old["endpointsFile"]]
    engine_change = copy.deepcopy(default_document())
    engine_change["spec"]["kvTransfer"]["bidirectional"] = False
    with pytest.raises(TopologyError, match="changes the engines"):
        topo.router_for(engine_change)


def test_volumes_map_under_the_state_and_cache_directories(tmp_path: Path) -> None:
    procs = plan(tmp_path)
    prefill = procs["local-prefill-0"]
    layout = Layout(state_dir=tmp_path, model_cache=Path(prefill.env["HF_HOME"]).parent)
    assert prefill.argv[len(VLLM_SERVE_LOCAL)] == str(layout.model_cache / "pdx-tiny")
    router_files = list(procs["local-router-0"].files)
    assert all(f.startswith(str(tmp_path)) for f in router_files)


def test_the_local_router_reads_the_tokenizer_of_the_model_the_engines_serve(tmp_path: Path) -> None:
    procs = plan(tmp_path)
    router, prefill = procs["local-router-0"], procs["local-prefill-0"]
    config = json.loads(router.files[router.argv[router.argv.index("--config") + 1]])
    assert config["tokenizer"] == prefill.argv[len(VLLM_SERVE_LOCAL)]  # the served model directory


def test_a_state_directory_owned_by_a_running_topology_is_refused(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import pytest

    from pdx.local.topology import STATE_ENV, TopologyError, recorded_alive, stop_recorded

    env = {**os.environ, STATE_ENV: str(tmp_path.resolve())}
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "pids.json").write_text(json.dumps({"local-router-0": sleeper.pid, "other": stranger.pid}))
        assert recorded_alive(tmp_path.resolve()) == {"local-router-0": sleeper.pid}
        with pytest.raises(TopologyError, match="pdx local down"):
            LocalTopology(default_document(), state_dir=tmp_path).start()
        assert stop_recorded(tmp_path.resolve()) == ["local-router-0"]
        assert sleeper.wait(10) != 0
        assert stranger.poll() is None  # not ours: left alone
    finally:
        sleeper.kill()
        stranger.kill()


def test_down_also_ends_the_up_process_that_owns_the_state_directory(tmp_path: Path) -> None:
    import subprocess
    import sys

    from pdx.local.topology import OWNER_FILE, _process_identity, stop_recorded

    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / OWNER_FILE).write_text(_process_identity(owner.pid))
        stop_recorded(tmp_path)
        assert owner.wait(10) != 0
        assert not (tmp_path / OWNER_FILE).exists()
    finally:
        owner.kill()


def test_down_leaves_a_process_that_only_reuses_the_owners_pid_alone(tmp_path: Path) -> None:
    import subprocess
    import sys

    from pdx.local.topology import OWNER_FILE, stop_recorded

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / OWNER_FILE).write_text(f"{other.pid} 1")  # same pid, another start time
        stop_recorded(tmp_path)
        assert other.poll() is None
    finally:
        other.kill()


def test_local_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    # An ephemeral port can be taken by any socket before the engine binds it (a UCX listener
    # once took prefill's HTTP port); one below the range only by an explicit bind.
    from pdx.local.topology import ephemeral_port_low, free_port

    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == 40
    assert all(1024 <= p < ephemeral_port_low() for p in ports)


def test_pdx_local_refuses_a_file_with_a_duplicate_key_as_kubectl_does(tmp_path: Path) -> None:
    cr = tmp_path / "dup.yaml"
    cr.write_text(
        "apiVersion: inference.pdx.dev/v1alpha1\nkind: DisaggregatedInference\nmetadata: {name: a}\n"
        "spec:\n  model: {name: x}\n  model: {name: y}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pdx", "local", "plan", "-f", str(cr)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr and "line 6" in proc.stderr, proc.stderr


def test_an_engine_keeps_its_side_channel_port_from_leg_to_leg_so_vllms_compile_cache_key_holds(
    tmp_path: Path,
) -> None:
    """vLLM hashes VLLM_NIXL_SIDE_CHANNEL_PORT into its torch.compile cache key: a new port per start
    compiled every GPU engine again (21-25 s a start on the H100). The next leg's plan of the same pods
    (bidirectional flipped: new engines) gets the same ports; another state directory does not share them."""
    doc = copy.deepcopy(default_document())
    first = plan(tmp_path, doc)
    doc["spec"]["kvTransfer"]["bidirectional"] = not doc["spec"]["kvTransfer"].get("bidirectional", True)
    second = plan(tmp_path, doc)
    engines = [name for name, p in first.items() if p.role != "router"]
    assert len(engines) == 2
    for name in engines:
        assert first[name].env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == second[name].env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert len({second[n].env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for n in engines}) == 2
    other = plan(tmp_path / "other", doc)
    assert {other[n].env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for n in engines}.isdisjoint(
        {first[n].env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for n in engines}
    )
