"""The rendered NetworkPolicies admit what pdx needs and nothing else, judged connection by
connection with a NetworkPolicy evaluator (tests/render/netpol.py)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from pdx.render import config_hash, render
from pdx.resource import SpecError
from tests.render.netpol import Pod, admitted
from tests.render.test_render import K8S_VERSION, target

NS = "inference"
SIDE = 5600
UCX_PORT = 41234  # an ephemeral port UCX's TCP transport might listen on
OPERATOR = Pod("pdx-system", {"app.kubernetes.io/part-of": "pdx", "app.kubernetes.io/component": "operator"})
STRANGER = Pod(NS, {"app": "curious"})
SCRAPER = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
SCRAPER_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
CLIENT = Pod("apps", {"app": "chat"})
CLIENT_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}


def pods(objects: list[dict[str, Any]]) -> dict[str, Pod]:
    """The pod of each workload (component -> Pod) as the policies see it."""
    out = {}
    for o in objects:
        if o["kind"] in ("StatefulSet", "Deployment"):
            labels = o["spec"]["template"]["metadata"]["labels"]
            out[labels["app.kubernetes.io/component"]] = Pod(o["metadata"]["namespace"], labels)
    return out


def rendered(**changes: Any) -> tuple[list[dict[str, Any]], dict[str, Pod]]:
    objects = render(target(**changes))
    return objects, pods(objects)


def test_engines_take_http_only_from_their_router() -> None:
    objs, p = rendered()
    other, _ = rendered(metadata__name="other")
    policies = objs + other
    other_router = pods(other)["router"]
    for role in ("prefill", "decode"):
        assert admitted(policies, p["router"], p[role], 8000)
        assert not admitted(policies, p["router"], p[role], SIDE)
        for src in (STRANGER, OPERATOR, other_router, SCRAPER):
            assert not admitted(policies, src, p[role], 8000), src
    assert not admitted(policies, p["prefill"], p["decode"], 8000)


def test_kv_transfer_on_efa_uses_only_the_side_channel_between_opposite_roles() -> None:
    objs, p = rendered()  # p5en: LIBFABRIC over EFA, whose RDMA is not IP
    other, q = rendered(metadata__name="other")
    policies = objs + other
    assert admitted(policies, p["decode"], p["prefill"], SIDE)
    assert admitted(policies, p["prefill"], p["decode"], SIDE)  # bidirectional: prefill reads decode's KV
    assert not admitted(policies, p["decode"], p["prefill"], UCX_PORT)
    assert not admitted(policies, p["prefill"], p["prefill"], SIDE)  # same role
    assert not admitted(policies, p["decode"], p["decode"], SIDE)
    assert not admitted(policies, q["decode"], p["prefill"], SIDE)  # another resource
    assert not admitted(policies, p["router"], p["prefill"], SIDE)
    assert not admitted(policies, STRANGER, p["decode"], SIDE)


def test_kv_transfer_over_ucx_opens_every_port_but_only_between_opposite_roles() -> None:
    objs, p = rendered(spec__placement__instanceType="cpu")  # UCX over TCP: ephemeral ports
    other, q = rendered(metadata__name="other", spec__placement__instanceType="cpu")
    policies = objs + other
    for port in (SIDE, UCX_PORT):
        assert admitted(policies, p["decode"], p["prefill"], port)
        assert admitted(policies, p["prefill"], p["decode"], port)
        assert not admitted(policies, p["prefill"], p["prefill"], port)
        assert not admitted(policies, q["decode"], p["prefill"], port)
        assert not admitted(policies, STRANGER, p["prefill"], port)


def test_engines_reach_dns_the_opposite_role_and_public_https_but_not_the_metadata_service() -> None:
    objs, p = rendered()
    for role in ("prefill", "decode"):
        assert admitted(objs, p[role], "10.100.0.10", 53, "UDP")
        assert admitted(objs, p[role], "104.18.0.1", 443)  # the hub's CDN
        assert admitted(objs, p[role], "2606:4700::1", 443)
        assert not admitted(objs, p[role], "169.254.169.254", 80)  # the node's metadata service
        assert not admitted(objs, p[role], "169.254.169.254", 443)
        assert not admitted(objs, p[role], "10.0.3.7", 443)  # anything inside the VPC
        assert not admitted(objs, p[role], "104.18.0.1", 80)
        assert admitted(objs, p[role], p["router"], 8000) is (role == "decode")  # a draining decode asks
        assert not admitted(objs, p[role], STRANGER, 8000)


def test_a_draining_decode_may_ask_the_router_what_it_holds_even_with_clients_set() -> None:
    objs, p = rendered(spec__network__clients=[{"ipBlock": {"cidr": "10.9.0.0/16"}}])
    assert admitted(objs, p["decode"], p["router"], 8000)
    assert not admitted(objs, p["prefill"], p["router"], 8000)
    off, q = rendered(
        spec__network__clients=[{"ipBlock": {"cidr": "10.9.0.0/16"}}], spec__kvTransfer__bidirectional=False
    )
    assert not admitted(off, q["decode"], q["router"], 8000)  # no KV held for reuse: no drain


def test_model_download_can_be_closed_or_narrowed_to_a_mirror() -> None:
    closed, p = rendered(spec__network__modelDownload=[])
    assert not admitted(closed, p["prefill"], "104.18.0.1", 443)
    assert admitted(closed, p["prefill"], "10.100.0.10", 53, "UDP")
    mirror, q = rendered(spec__network__modelDownload=[{"ipBlock": {"cidr": "10.0.8.0/24"}}])
    assert admitted(mirror, q["decode"], "10.0.8.20", 443)
    assert not admitted(mirror, q["decode"], "104.18.0.1", 443)


def test_router_takes_any_client_by_default() -> None:
    objs, p = rendered()
    for src in (STRANGER, CLIENT, "203.0.113.9"):
        assert admitted(objs, src, p["router"], 8000)
    assert not admitted(objs, STRANGER, p["router"], 9000)


def test_router_takes_only_clients_the_operator_and_scrapers_once_clients_are_set() -> None:
    objs, p = rendered(
        spec__network__clients=[CLIENT_PEER, {"ipBlock": {"cidr": "203.0.113.0/24"}}],
        spec__network__metricsScrapers=[SCRAPER_PEER],
    )
    for src in (CLIENT, "203.0.113.9", OPERATOR, SCRAPER):
        assert admitted(objs, src, p["router"], 8000), src
    for src in (STRANGER, "198.51.100.1", Pod("elsewhere", {"app.kubernetes.io/component": "operator"})):
        assert not admitted(objs, src, p["router"], 8000), src
    assert admitted(objs, SCRAPER, p["prefill"], 8000)  # engine /metrics
    assert not admitted(objs, SCRAPER, p["prefill"], SIDE)
    nobody, q = rendered(spec__network__clients=[], spec__network__operator=[])
    assert not admitted(nobody, OPERATOR, q["router"], 8000)
    assert not admitted(nobody, CLIENT, q["router"], 8000)


def test_router_reaches_dns_its_engines_http_and_redis_only() -> None:
    objs, p = rendered()
    other, q = rendered(metadata__name="other")
    policies = objs + other
    assert admitted(policies, p["router"], "10.100.0.10", 53, "UDP")
    assert admitted(policies, p["router"], p["decode"], 8000)
    assert not admitted(policies, p["router"], q["decode"], 8000)
    assert not admitted(policies, p["router"], "104.18.0.1", 443)
    assert not admitted(policies, p["router"], "10.0.5.5", 6379)
    redis, r = rendered(
        spec__router__store={"kind": "redis", "url": "rediss://cache.internal:6380/0"}, spec__router__replicas=2
    )
    assert admitted(redis, r["router"], "10.0.5.5", 6380)
    assert not admitted(redis, r["router"], "10.0.5.5", 6379)


def test_every_pod_of_an_instance_has_ingress_and_egress_policies() -> None:
    objs, p = rendered()
    for component, pod in p.items():
        covering = [
            o for o in objs
            if o["kind"] == "NetworkPolicy"
            and o["spec"]["podSelector"]["matchLabels"].items() <= pod.labels.items()
        ]  # fmt: skip
        assert covering, component
        assert all(o["spec"]["policyTypes"] == ["Ingress", "Egress"] for o in covering)


def test_policies_with_every_kind_of_peer_are_valid_kubernetes_objects() -> None:
    objs, _ = rendered(
        spec__network__clients=[
            CLIENT_PEER,
            {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}},
            {"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}},
        ],
        spec__network__metricsScrapers=[SCRAPER_PEER],
        spec__network__modelDownload=[{"ipBlock": {"cidr": "10.0.8.0/24"}}],
        spec__router__store={"kind": "redis", "url": "redis://cache:6379"},
        spec__router__replicas=2,
    )
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert len(policies) == 3
    for obj in policies:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("peer", [{}, {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}])
def test_a_peer_kubernetes_would_refuse_is_refused_naming_the_field(peer: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=r"spec\.network\.clients: .*ipBlock alone"):
        target(spec__network__clients=[peer])


def test_changing_network_peers_does_not_roll_the_engines() -> None:
    assert config_hash(target(spec__network__clients=[CLIENT_PEER])) == config_hash(target())
