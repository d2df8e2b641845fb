"""Rendering: valid Kubernetes objects, one config for both roles, hashes that roll together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdx.render import config_hash, render
from pdx.render.engines import kv_transfer_config
from pdx.resource import Target, load
from pdx_engine import held_kv, tokenize_cache

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSION = "1.37.0"


def target(path: Path = ROOT / "examples" / "seed-qwen3-32b-1p1d.yaml", **changes: Any) -> Target:
    doc = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        node = doc
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return load(doc)


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container_arg(sts: dict[str, Any], flag: str) -> str:
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index(flag) + 1])


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_rendered_object_validates_against_the_kubernetes_schema(path: Path) -> None:
    uid_doc = yaml.safe_load(path.read_text())
    uid_doc["metadata"]["uid"] = "0d2c3b3e-1111-2222-3333-444455556666"
    for obj in render(load(uid_doc)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_both_roles_get_the_same_kv_transfer_config_but_for_role_and_engine_id() -> None:
    t = target()
    sets = by_kind(render(t), "StatefulSet")
    configs = {name: json.loads(container_arg(s, "--kv-transfer-config")) for name, s in sets.items()}
    prefill, decode = configs["qwen3-32b-prefill"], configs["qwen3-32b-decode"]
    assert (prefill.pop("kv_role"), decode.pop("kv_role")) == ("kv_producer", "kv_consumer")
    assert prefill == decode
    assert prefill["kv_connector_extra_config"] == {
        "backends": ["LIBFABRIC"],
        "bidirectional_kv_xfer": True,
        "decoder_kv_blocks_ttl": 480,
        "kv_recompute_threshold": 64,
        "kv_lease_duration": 120,
    }
    assert "kv_rank" not in prefill and "kv_parallel_size" not in prefill


def test_ttl_and_threshold_come_from_the_spec() -> None:
    t = target(spec__kvTransfer={"decoderKvBlocksTtlSeconds": 900, "kvRecomputeThreshold": 256, "bidirectional": False})
    extra = kv_transfer_config(t, "decode")["kv_connector_extra_config"]
    assert (extra["decoder_kv_blocks_ttl"], extra["kv_recompute_threshold"], extra["bidirectional_kv_xfer"]) == (
        900,
        256,
        False,
    )
    router_cfg = json.loads(by_kind(render(t), "ConfigMap")["qwen3-32b-router"]["data"]["router.json"])
    assert router_cfg["conversationTtlSeconds"] == 870
    assert router_cfg["kvRecomputeThreshold"] == 256


def test_the_lease_from_the_spec_is_rendered_on_both_roles() -> None:
    sets = by_kind(render(target(spec__kvTransfer={"kvLeaseDurationSeconds": 300})), "StatefulSet")
    leases = {
        name: json.loads(container_arg(s, "--kv-transfer-config"))["kv_connector_extra_config"]["kv_lease_duration"]
        for name, s in sets.items()
    }
    # prefill holds and renews its blocks by it, decode times its heartbeats by it: both must have it
    assert leases == {"qwen3-32b-prefill": 300, "qwen3-32b-decode": 300}


def test_engine_ids_are_left_to_each_process_and_side_channel_host_is_the_pod_ip() -> None:
    sts = by_kind(render(target()), "StatefulSet")["qwen3-32b-decode"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert "engine_id" not in json.loads(container_arg(sts, "--kv-transfer-config"))  # see kv_transfer_config
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["value"] == "$(POD_IP)"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    names = [e["name"] for e in container["env"]]
    assert names.index("POD_IP") < names.index("VLLM_NIXL_SIDE_CHANNEL_HOST")  # $(VAR) needs it defined first


def test_seed_setup_gets_efa_devices_gpus_and_libfabric_environment() -> None:
    sts = by_kind(render(target()), "StatefulSet")["qwen3-32b-prefill"]
    pod = sts["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == ("8", "16")
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["FI_PROVIDER"], env["PDX_REQUIRE_EFA"]) == ("efa", "1")
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert "--no-enable-prefix-caching" in pod["containers"][0]["args"]  # benchmark profile: prefill only
    decode = by_kind(render(target()), "StatefulSet")["qwen3-32b-decode"]
    assert "--enable-prefix-caching" in decode["spec"]["template"]["spec"]["containers"][0]["args"]


def test_an_engine_without_gpus_on_an_efa_node_asks_for_no_efa_device_nor_hugepages() -> None:
    # The API server refuses hugepages without a cpu or memory request ("HugePages require cpu
    # or memory"), and an engine without GPUs has neither unless given: it would never apply.
    t = target(spec__prefill__resources={"gpus": 0})
    limits = by_kind(render(t), "StatefulSet")["qwen3-32b-prefill"]["spec"]["template"]["spec"]["containers"][0][
        "resources"
    ].get("limits", {})
    assert "hugepages-2Mi" not in limits and "vpc.amazonaws.com/efa" not in limits
    decode = by_kind(render(t), "StatefulSet")["qwen3-32b-decode"]["spec"]["template"]["spec"]["containers"][0]
    assert "hugepages-2Mi" in decode["resources"]["limits"]  # decode, on its GPUs, still uses EFA


def test_tp4_engines_take_half_a_node() -> None:
    t = target(ROOT / "examples" / "qwen3-32b-2p2d.yaml")
    limits = by_kind(render(t), "StatefulSet")["qwen3-32b-2p2d-decode"]["spec"]["template"]["spec"]["containers"][0][
        "resources"
    ]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"], limits["memory"]) == ("4", "8", "950Gi")


def test_cpu_placement_uses_ucx_and_cpu_buffers_without_efa() -> None:
    t = target(ROOT / "examples" / "local-cpu.yaml")
    cfg = kv_transfer_config(t, "prefill")
    assert (cfg["kv_buffer_device"], cfg["kv_connector_extra_config"]["backends"]) == ("cpu", ["UCX"])
    pod = by_kind(render(t), "StatefulSet")["local-prefill"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert "FI_PROVIDER" not in env and "PDX_REQUIRE_EFA" not in env


def test_a_kv_edit_rolls_both_roles_to_one_new_hash_and_scaling_does_not() -> None:
    def hashes(t: Target) -> set[str]:
        sets = by_kind(render(t), "StatefulSet").values()
        return {s["spec"]["template"]["metadata"]["labels"]["pdx.dev/config-hash"] for s in sets}

    before = hashes(target())
    after_ttl = hashes(target(spec__kvTransfer={"decoderKvBlocksTtlSeconds": 600}))
    after_lease = hashes(target(spec__kvTransfer={"kvLeaseDurationSeconds": 60}))
    scaled = hashes(target(spec__decode={"replicas": 3, "tensorParallelSize": 8}))
    assert len(before) == len(after_ttl) == len(after_lease) == 1
    assert len(before | after_ttl | after_lease) == 3
    assert scaled == before


def test_children_are_owned_only_when_the_uid_is_known() -> None:
    offline = render(target())
    assert all("ownerReferences" not in o["metadata"] for o in offline)
    doc = yaml.safe_load((ROOT / "examples" / "seed-qwen3-32b-1p1d.yaml").read_text())
    doc["metadata"]["uid"] = "abc-123"
    owned = render(load(doc))
    refs = {o["metadata"]["ownerReferences"][0]["uid"] for o in owned}
    assert refs == {"abc-123"}


def test_every_child_carries_standard_labels_and_role() -> None:
    for obj in render(target()):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "qwen3-32b"
        assert labels["app.kubernetes.io/managed-by"] == "pdx-operator"
        assert labels["app.kubernetes.io/component"]


def test_router_config_carries_the_generation_the_engines_carry() -> None:
    t = target()
    cfg = json.loads(by_kind(render(t), "ConfigMap")["qwen3-32b-router"]["data"]["router.json"])
    assert cfg["generation"] == config_hash(t)
    assert cfg["servedModelName"] == "Qwen"
    assert cfg["endpointsFile"] == "/etc/pdx/endpoints/endpoints.json"


def test_router_tokenizer_reads_the_model_from_a_read_only_mount_of_the_cache_pvc() -> None:
    t = target(
        spec__router__tokenizer="router", spec__modelCache__claimName="models", spec__model__name="/models/Qwen3-32B"
    )
    objects = render(t)
    cfg = json.loads(by_kind(objects, "ConfigMap")["qwen3-32b-router"]["data"]["router.json"])
    assert cfg["tokenizer"] == "/models/Qwen3-32B"
    pod = by_kind(objects, "Deployment")["qwen3-32b-router"]["spec"]["template"]["spec"]
    assert {"name": "model-cache", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_by_default_the_engine_tokenizes_and_the_router_mounts_no_cache() -> None:
    objects = render(target())
    cfg = json.loads(by_kind(objects, "ConfigMap")["qwen3-32b-router"]["data"]["router.json"])
    assert cfg["tokenizer"] is None
    pod = by_kind(objects, "Deployment")["qwen3-32b-router"]["spec"]["template"]["spec"]
    assert all(v["name"] != "model-cache" for v in pod["volumes"])


def test_engines_keep_prompt_ids_for_the_next_turn_unless_a_role_turns_it_off() -> None:
    sets = by_kind(render(target(spec__decode={"tokenizeCache": "0"})), "StatefulSet")

    def env(name: str) -> dict[str, Any]:
        return {e["name"]: e.get("value") for e in sets[name]["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert env("qwen3-32b-prefill")[tokenize_cache.ENV] == str(64 << 20)  # the name the plugin reads
    assert tokenize_cache.ENV not in env("qwen3-32b-decode")


def _engine_env(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    container = by_kind(objects, "StatefulSet")[name]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_decode_releases_held_kv_under_pressure_unless_the_resource_turns_it_off() -> None:
    on = render(target())
    assert held_kv.ENV not in _engine_env(on, "qwen3-32b-decode")  # the plugin's default: on
    off = render(target(spec__kvTransfer__releaseUnderPressure=False))
    assert _engine_env(off, "qwen3-32b-decode")[held_kv.ENV] == "0"  # the name the plugin reads
    assert held_kv.ENV not in _engine_env(off, "qwen3-32b-prefill")
    assert held_kv.valve_from_env({held_kv.ENV: "0"}) is False


def test_held_kvs_share_of_decodes_cache_is_rendered_for_decode_only() -> None:
    assert held_kv.FRACTION_ENV not in _engine_env(render(target()), "qwen3-32b-decode")
    capped = render(target(spec__kvTransfer__heldKvMaxFraction=0.5))
    raw = _engine_env(capped, "qwen3-32b-decode")[held_kv.FRACTION_ENV]
    assert held_kv.max_fraction_from_env({held_kv.FRACTION_ENV: raw}) == 0.5  # what the plugin reads
    assert held_kv.FRACTION_ENV not in _engine_env(capped, "qwen3-32b-prefill")
