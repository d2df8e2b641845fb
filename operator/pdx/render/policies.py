"""NetworkPolicies and PodDisruptionBudgets: who may talk to whom, how many may go at once.

Every pod of an instance gets ingress and egress policies that admit only what pdx needs
(docs/operator.md, "Least privilege", has the table):

- an engine takes HTTP from its router (and `network.metricsScrapers`) and KV transfer from
  the opposite role of the same resource only; it reaches DNS, the opposite role, and the
  model download (`network.modelDownload`);
- the router takes its API port from `network.clients` (unset: anyone), the operator (reads
  /v1/pdx/stats) and the scrapers; it reaches DNS, its engines' HTTP port and Redis.

Kubelet probes come from the node, which the usual CNIs (Calico, Cilium, the VPC CNI's policy
agent) always admit.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import urlsplit

from pdx import labels
from pdx.render import meta
from pdx.render.engines import drain
from pdx.render.meta import HTTP_PORT, ROLES, Role
from pdx.resource import Target
from pdx.spec import NetworkPeer

OPPOSITE: dict[Role, Role] = {"prefill": "decode", "decode": "prefill"}
HTTPS_PORT = 443
REDIS_PORT = 6379
DNS: list[dict[str, Any]] = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
# What "the public internet" leaves out: private, shared (CGNAT), loopback and link-local
# ranges (169.254.169.254 and fd00:ec2::254 are the node's metadata service).
NON_PUBLIC_V4 = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
                 "192.168.0.0/16"]  # fmt: skip
NON_PUBLIC_V6 = ["::1/128", "fc00::/7", "fe80::/10"]
PUBLIC: list[dict[str, Any]] = [
    {"ipBlock": {"cidr": "0.0.0.0/0", "except": NON_PUBLIC_V4}},
    {"ipBlock": {"cidr": "::/0", "except": NON_PUBLIC_V6}},
]


def _peers(peers: list[NetworkPeer]) -> list[dict[str, Any]]:
    return [p.model_dump(by_alias=True, exclude_none=True, mode="json") for p in peers]


def _pods(target: Target, component: str) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": meta.selector(target, component)}}


def _engines(target: Target) -> dict[str, Any]:
    return {"podSelector": {"matchLabels": {**labels.instance(target.name), labels.ENGINE: "true"}}}


def kv_ports(target: Target) -> list[dict[str, Any]] | None:
    """The ports KV transfer uses between the roles; None: every port.

    NIXL's handshake is vLLM's side channel (one TCP port: pdx runs no data parallelism). With
    LIBFABRIC on EFA alone the KV itself moves by RDMA, which is not IP and no NetworkPolicy
    sees. UCX (and libfabric without EFA) moves it over TCP connections to ephemeral ports,
    opened both ways once reads go in both directions (bidirectional): those cannot be
    listed, so between the two roles every port stays open, and only between them.
    """
    spec = target.spec
    if spec.uses_efa and spec.backends == ["LIBFABRIC"]:
        return [{"protocol": "TCP", "port": spec.kv_transfer.side_channel_port}]
    return None


def _rule(direction: str, peers: list[dict[str, Any]], ports: list[dict[str, Any]] | None) -> dict[str, Any]:
    rule: dict[str, Any] = {direction: peers}
    if ports is not None:
        rule["ports"] = ports
    return rule


def engine_network_policy(target: Target, role: Role) -> dict[str, Any]:
    """One role's engines: HTTP from the router, KV transfer with the opposite role only."""
    net = target.spec.network
    http = [{"protocol": "TCP", "port": HTTP_PORT}]
    egress = [
        {"ports": copy.deepcopy(DNS)},
        _rule("to", [_pods(target, OPPOSITE[role])], kv_ports(target)),
    ]
    download = copy.deepcopy(PUBLIC) if net.model_download is None else _peers(net.model_download)
    if download:
        egress.append({"to": download, "ports": [{"protocol": "TCP", "port": HTTPS_PORT}]})
    if role == "decode" and drain(target, role):  # the preStop asks the router what it holds
        router_port = [{"protocol": "TCP", "port": target.spec.router.port}]
        egress.append({"to": [_pods(target, "router")], "ports": router_port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.metadata(target, meta.engine_name(target, role), role),
        "spec": {
            "podSelector": {"matchLabels": meta.selector(target, role)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [_pods(target, "router"), *_peers(net.metrics_scrapers)], "ports": http},
                _rule("from", [_pods(target, OPPOSITE[role])], kv_ports(target)),
            ],
            "egress": egress,
        },
    }


def router_network_policy(target: Target) -> dict[str, Any]:
    """The router: its port from clients, the operator and scrapers; out to engines, Redis, DNS."""
    spec, net = target.spec, target.spec.network
    port = [{"protocol": "TCP", "port": spec.router.port}]
    if net.clients is None:
        ingress = [{"ports": port}]  # no `from`: any source
    else:
        sources = _peers([*net.clients, *net.operator, *net.metrics_scrapers])
        if drain(target, "decode"):  # a draining decode's preStop asks what it still holds
            sources.append(_pods(target, "decode"))
        ingress = [{"from": sources, "ports": port}] if sources else []
    egress: list[dict[str, Any]] = [
        {"ports": copy.deepcopy(DNS)},
        {"to": [_engines(target)], "ports": [{"protocol": "TCP", "port": HTTP_PORT}]},
    ]
    if spec.router.store.kind == "redis" and spec.router.store.url:
        # A Redis URL names a host, which a NetworkPolicy cannot select: only its port is held.
        egress.append({"ports": [{"protocol": "TCP", "port": urlsplit(spec.router.store.url).port or REDIS_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.metadata(target, meta.router_name(target), "router"),
        "spec": {
            "podSelector": {"matchLabels": meta.selector(target, "router")},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def network_policies(target: Target) -> list[dict[str, Any]]:
    return [*(engine_network_policy(target, r) for r in ROLES), router_network_policy(target)]


def _pdb(target: Target, name: str, component: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta.metadata(target, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": meta.selector(target, component)},
        },
    }


def disruption_budgets(target: Target) -> list[dict[str, Any]]:
    """One engine of a role at a time; the router only when it has replicas to spare."""
    out = [_pdb(target, meta.engine_name(target, r), r) for r in ROLES if target.spec.role(r).replicas > 0]
    if target.spec.router.replicas > 1:
        out.append(_pdb(target, meta.router_name(target), "router"))
    return out
