"""A small NetworkPolicy evaluator: would Kubernetes admit this connection under these policies?

The semantics of networking.k8s.io/v1 (what every conforming CNI enforces): a pod selected by
no policy of a direction is open in it; a selected pod admits a connection when any rule of any
selecting policy matches its peer and port. A connection needs the destination's ingress and
the source's egress. Namespaces carry only their `kubernetes.io/metadata.name` label.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)


Endpoint = Pod | str  # a pod, or an address outside the pod network


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for req in selector.get("matchExpressions") or []:
        present, value = req["key"] in labels, labels.get(req["key"])
        op = req["operator"]
        if (
            (op == "In" and value not in req["values"])
            or (op == "NotIn" and present and value in req["values"])
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def _peer_matches(peer: dict[str, Any], other: Endpoint, policy_ns: str) -> bool:
    if "ipBlock" in peer:
        if not isinstance(other, str):
            return False
        addr, block = ipaddress.ip_address(other), peer["ipBlock"]
        net = ipaddress.ip_network(block["cidr"])
        if addr.version != net.version or addr not in net:
            return False
        return not any(
            addr in ipaddress.ip_network(e)
            for e in block.get("except", [])
            if ipaddress.ip_network(e).version == addr.version
        )
    if isinstance(other, str):
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": other.namespace}):
            return False
    elif other.namespace != policy_ns:
        return False
    return _selects(peer.get("podSelector", {}), other.labels)


def _port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    return ports is None or any(p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports)


def _side(policies: list[dict[str, Any]], pod: Pod, other: Endpoint, port: int, protocol: str, kind: str) -> bool:
    key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
    selecting = [
        p for p in policies
        if p["kind"] == "NetworkPolicy"
        and p["metadata"]["namespace"] == pod.namespace
        and kind in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], pod.labels)
    ]  # fmt: skip
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            peers = rule.get(peers_key)
            if _port_matches(rule, port, protocol) and (
                peers is None or any(_peer_matches(peer, other, pod.namespace) for peer in peers)
            ):
                return True
    return False


def admitted(policies: list[dict[str, Any]], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    """Whether a connection from `src` to `dst` on `port` passes both ends' policies."""
    ingress = _side(policies, dst, src, port, protocol, "Ingress") if isinstance(dst, Pod) else True
    egress = _side(policies, src, dst, port, protocol, "Egress") if isinstance(src, Pod) else True
    return ingress and egress
