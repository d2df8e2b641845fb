"""Cross-field rules, written once in CEL.

The CRD carries them as `x-kubernetes-validations` on `spec` (the API server evaluates them on
`kubectl apply`/`edit`), and the models evaluate the very same expressions with cel-python on
the same defaulted document, so both reject the same inputs with the same message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel

from pdx.profiles import PROFILES
from pdx.protocol import PREFILL_DECLINE_WINDOW_SECONDS

# ---------------------------------------------------------------- Kubernetes' quantity library
# The API server's CEL has `quantity(s)` (Kubernetes 1.29 and later); cel-python has not, so
# the models (and tests/spec) evaluate rules with this subset of it: the quantities spec.py's
# pattern admits, and `asApproximateFloat()`.

_SUFFIXES: dict[str, int | float] = {
    "": 1, "m": 1e-3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")


def quantity_value(text: str) -> float:
    """A Kubernetes quantity ("512Mi", "1.5Gi", "100m") as a number (bytes for memory)."""
    match = _QUANTITY.match(text)
    if match is None or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{text!r} is not a quantity like 512Mi or 1Gi")
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def _cel_quantity(text: Any) -> celtypes.DoubleType:
    return celtypes.DoubleType(quantity_value(str(text)))


# name -> implementation, for celpy programs: `quantity(s)` is its value, and
# `.asApproximateFloat()` on it that value as a double.
KUBERNETES_FUNCTIONS: dict[str, Any] = {
    "quantity": _cel_quantity,
    "asApproximateFloat": lambda q: celtypes.DoubleType(q),
}


@dataclass(frozen=True)
class Rule:
    """One CEL rule on `spec`: the expression must be true; otherwise `message` applies to `field`."""

    field: str
    expression: str
    message: str

    def to_crd(self) -> dict[str, str]:
        return {"rule": self.expression, "message": self.message, "fieldPath": f".{self.field}"}


def _profile_map(attr: str) -> str:
    return "{" + ", ".join(f"'{k}': {getattr(p, attr)}" for k, p in sorted(PROFILES.items())) + "}"


_KNOWN = "[" + ", ".join(f"'{k}'" for k in sorted(PROFILES)) + "]"
# GPUs / EFA devices per node: the explicit override, else the profile table (0 when unknown).
_NODE_GPUS = (
    "(has(self.placement.gpusPerNode) ? self.placement.gpusPerNode : "
    f"(self.placement.instanceType in {_KNOWN} ? {_profile_map('gpus')}[self.placement.instanceType] : 0))"
)
_NODE_EFA = (
    "(has(self.placement.efaDevicesPerNode) ? self.placement.efaDevicesPerNode : "
    f"(self.placement.instanceType in {_KNOWN} ? {_profile_map('efa_devices')}[self.placement.instanceType] : 0))"
)


def _tp_fits(role: str) -> Rule:
    return Rule(
        field=f"{role}.tensorParallelSize",
        expression=f"{_NODE_GPUS} == 0 || self.{role}.tensorParallelSize <= {_NODE_GPUS}",
        message=(
            f"{role}.tensorParallelSize exceeds the GPUs of one node of placement.instanceType: "
            "lower it, or pick an instance type (or placement.gpusPerNode) with enough GPUs"
        ),
    )


# metadata.name: StatefulSet pods carry a controller-revision-hash label built from the set's
# name (at most 63 characters), so pdx's names stay short. The API server's own check only asks
# for a DNS subdomain (253 characters, dots allowed): the CRD adds this rule on the whole object.
MAX_NAME_LENGTH = 40
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_PROBLEM = (
    f"must be a DNS label of at most {MAX_NAME_LENGTH} characters (lower-case letters, digits, '-'): "
    "rename the resource"
)
NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{DNS_LABEL}')",
    "messageExpression": f'"\'" + self.metadata.name + "\' {NAME_PROBLEM}"',
    "fieldPath": ".metadata.name",
}

# The router's memory: its entry store (memory kind) takes up to store.maxBytes as estimated
# per entry, times this factor in RSS (Python's allocator, the estimate's error), on top of a
# base for everything else (the interpreter, in-flight turns). Measured on a 2-core VM with
# scripts/bench_store_memory.py: RSS grew 1.23x the store's estimate over 400 16k-token
# entries; a router idle at 57 MiB held 123 MiB after 512 16k-token turns, 64 at a time,
# storing nothing: the base leaves room for ~190 such turns in flight.
STORE_OVERHEAD_FACTOR = 1.5
ROUTER_BASE_MEMORY_BYTES = 256 * 2**20

W = PREFILL_DECLINE_WINDOW_SECONDS
# kvTransfer.kvLeaseDurationSeconds has bounds (the schema's minimum/maximum) but no rule here: in
# vLLM 0.32 it times only prefill's blocks of a finished prefill, held until decode's P->D read.
# decoderKvBlocksTtlSeconds times other blocks (decode's, for the next turn's D->P read), fixed and
# never renewed, and the router's entry deadline follows that TTL alone (pull_scheduler.request_finished
# picks one or the other by role). Prefill and decode must agree on the lease (decode's heartbeat
# interval against prefill's renewal), which one field rendered into both roles already ensures.
# Decode arguments with which its first token is not simply the one it is told to start with.
FIRST_TOKEN_CONFLICTS = (
    "--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice", "--speculative-config",
    "--logits-processors",
)  # fmt: skip


def _args_name(where: str, flags: tuple[str, ...]) -> str:
    """CEL: `where`.extraArgs holds one of `flags` (alone, or as `--flag=value`; the flags are no
    prefix of another vLLM flag)."""
    match = " || ".join(f"a.startsWith('{f}')" for f in flags)
    return f"(has(self.{where}.extraArgs) && self.{where}.extraArgs.exists(a, {match}))"


def _peer_rule(field: str) -> Rule:
    """A NetworkPolicy peer is an ipBlock alone, or selectors: Kubernetes refuses anything else."""
    return Rule(
        field=f"network.{field}",
        expression=(
            f"!has(self.network) || !has(self.network.{field}) || self.network.{field}.all(p, has(p.ipBlock) ? "
            "!has(p.podSelector) && !has(p.namespaceSelector) : (has(p.podSelector) || has(p.namespaceSelector)))"
        ),
        message=(
            f"each network.{field} peer needs either ipBlock alone or a podSelector and/or a "
            "namespaceSelector ({} selects all): split a peer that has both into two"
        ),
    )


RULES: tuple[Rule, ...] = (
    Rule(
        field="router.conversationTtlSeconds",
        expression=(
            "!has(self.router.conversationTtlSeconds) || "
            f"self.router.conversationTtlSeconds <= self.kvTransfer.decoderKvBlocksTtlSeconds - {W}"
        ),
        message=(
            f"router.conversationTtlSeconds must be at most kvTransfer.decoderKvBlocksTtlSeconds - {W} "
            f"(prefill declines reads in decode's last {W} s): lower it, or raise the decoder TTL"
        ),
    ),
    Rule(
        field="placement.instanceType",
        expression=(
            f"self.placement.instanceType in {_KNOWN} || "
            "(has(self.placement.gpusPerNode) && has(self.placement.efaDevicesPerNode))"
        ),
        message=(
            f"placement.instanceType has no profile (known: {', '.join(sorted(PROFILES))}): "
            "use one of those, or set placement.gpusPerNode and placement.efaDevicesPerNode"
        ),
    ),
    _tp_fits("prefill"),
    _tp_fits("decode"),
    Rule(
        field="decode.tensorParallelSize",
        expression=(
            "self.prefill.tensorParallelSize >= self.decode.tensorParallelSize ? "
            "self.prefill.tensorParallelSize % self.decode.tensorParallelSize == 0 : "
            "self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0"
        ),
        message=(
            "prefill.tensorParallelSize and decode.tensorParallelSize must divide one another "
            "(NixlConnector maps KV heads between ranks by their ratio): e.g. 8 and 4, not 8 and 3"
        ),
    ),
    Rule(
        field="kvTransfer.loadFailurePolicy",
        expression="!(self.kvTransfer.bidirectional && self.kvTransfer.loadFailurePolicy == 'recompute')",
        message=(
            "kvTransfer.loadFailurePolicy 'recompute' hangs expired D->P reads in vLLM 0.32/0.33: "
            "use 'fail' (the router retries the turn without reuse) or turn bidirectional off"
        ),
    ),
    Rule(
        field="kvTransfer.heldKvMaxFraction",
        expression="!has(self.kvTransfer.heldKvMaxFraction) || self.kvTransfer.releaseUnderPressure",
        message=(
            "kvTransfer.heldKvMaxFraction needs releaseUnderPressure: true (the valve releases held KV "
            "above the fraction): remove heldKvMaxFraction, or set releaseUnderPressure: true"
        ),
    ),
    Rule(
        field="kvTransfer.backends",
        expression=(f"!has(self.kvTransfer.backends) || !('LIBFABRIC' in self.kvTransfer.backends) || {_NODE_EFA} > 0"),
        message=(
            "kvTransfer.backends LIBFABRIC needs EFA devices on the node: use UCX, or an instance "
            "type (or placement.efaDevicesPerNode) with EFA"
        ),
    ),
    Rule(
        field="kvTransfer.backends",
        expression=(
            "!has(self.kvTransfer.backends) || !('LIBFABRIC' in self.kvTransfer.backends) || "
            "size(self.kvTransfer.backends) == 1 || "
            "(has(self.placement.efaCheck) && !self.placement.efaCheck)"
        ),
        message=(
            "kvTransfer.backends must list LIBFABRIC alone on EFA nodes (the engine refuses to start when NIXL "
            "also instantiates another backend, whose KV would go over TCP), or set placement.efaCheck: false"
        ),
    ),
    Rule(
        field="router.decodeLocalIdleMaxTokens",
        expression=(
            "!has(self.router.decodeLocalIdleMaxTokens) || !has(self.router.decodeLocalMaxTokens) || "
            "self.router.decodeLocalIdleMaxTokens == 0 || "
            "self.router.decodeLocalIdleMaxTokens >= self.router.decodeLocalMaxTokens"
        ),
        message=(
            "router.decodeLocalIdleMaxTokens below decodeLocalMaxTokens would change nothing (an idle decode "
            "already takes those turns): raise it to at least decodeLocalMaxTokens, or set 0 to turn it off"
        ),
    ),
    Rule(
        field="router.firstTokenFromPrefill",
        expression=(
            "!has(self.router.firstTokenFromPrefill) || !self.router.firstTokenFromPrefill || "
            f"!({_args_name('model', FIRST_TOKEN_CONFLICTS)} || {_args_name('decode', FIRST_TOKEN_CONFLICTS)})"
        ),
        message=(
            "router.firstTokenFromPrefill needs decode without "
            + ", ".join(FIRST_TOKEN_CONFLICTS)
            + " in model.extraArgs or decode.extraArgs (decode's first token would not be prefill's, or "
            "vLLM refuses the logits processor): remove those arguments, or set firstTokenFromPrefill: false"
        ),
    ),
    Rule(
        field="router.store.url",
        expression="self.router.store.kind != 'redis' || has(self.router.store.url)",
        message="router.store.url is required when router.store.kind is redis: set redis://HOST:6379/0",
    ),
    Rule(
        field="router.tokenizer",
        expression=(
            "self.router.tokenizer != 'router' || (has(self.modelCache.claimName) && "
            "self.model.name.startsWith(self.modelCache.mountPath + '/'))"
        ),
        message=(
            "router.tokenizer 'router' reads the tokenizer from the model cache: set "
            "modelCache.claimName and make model.name a path under modelCache.mountPath "
            "(e.g. /models/Qwen3-32B), or use 'engine'"
        ),
    ),
    *(_peer_rule(f) for f in ("clients", "metricsScrapers", "operator", "modelDownload")),
    Rule(
        field="router.tenancy.header",
        expression="(self.router.tenancy.identity == 'header') == has(self.router.tenancy.header)",
        message=(
            "router.tenancy.header names the header of identity 'header', and only of it: set both "
            "(e.g. identity: header, header: X-Tenant), or neither"
        ),
    ),
    Rule(
        field="router.tenantHeader",
        expression=(
            "!has(self.router.tenantHeader) || "
            "(self.router.tenancy.identity == 'apiKey' && !has(self.router.tenancy.header))"
        ),
        message=(
            "router.tenantHeader is the deprecated form of router.tenancy: remove it and set "
            "tenancy.identity: header, tenancy.header: <the header>"
        ),
    ),
    Rule(
        field="router.resources.memory",
        expression=(
            "self.router.store.kind != 'memory' || !has(self.router.resources.memory) || "
            "quantity(self.router.resources.memory).asApproximateFloat() >= "
            f"{STORE_OVERHEAD_FACTOR} * quantity(self.router.store.maxBytes).asApproximateFloat() + "
            f"{float(ROUTER_BASE_MEMORY_BYTES)}"
        ),
        message=(
            f"router.resources.memory is below what the entry store needs (router.store.maxBytes x "
            f"{STORE_OVERHEAD_FACTOR} + {ROUTER_BASE_MEMORY_BYTES // 2**20}Mi for the rest of the router): "
            "raise it, lower router.store.maxBytes, or leave router.resources.memory unset to derive it"
        ),
    ),
    *(
        Rule(
            field=f"{role}.autoscaling.maxReplicas",
            expression=(
                f"!has(self.{role}.autoscaling) || "
                f"self.{role}.autoscaling.minReplicas <= self.{role}.autoscaling.maxReplicas"
            ),
            message=f"{role}.autoscaling.maxReplicas must be at least minReplicas: raise it, or lower minReplicas",
        )
        for role in ("prefill", "decode")
    ),
    Rule(
        field="router.replicas",
        expression="self.router.replicas <= 1 || self.router.store.kind == 'redis'",
        message=(
            "router.replicas above 1 needs router.store.kind redis (replicas must share "
            "conversation entries): set the store, or use one replica"
        ),
    ),
)


@cache
def _programs() -> list[tuple[Rule, Any]]:
    env = celpy.Environment()
    return [(rule, env.program(env.compile(rule.expression), functions=KUBERNETES_FUNCTIONS)) for rule in RULES]


def warm_up() -> None:
    """Compile every rule now: cel-python builds its parser in about a second, which would
    otherwise land on the first reconcile pass after start-up."""
    _programs()


def violations(document: dict[str, Any]) -> list[Rule]:
    """Rules the defaulted `spec` document (camelCase, no nulls) breaks."""
    activation = {"self": json_to_cel(document)}
    broken = []
    for rule, program in _programs():
        if not bool(program.evaluate(activation)):
            broken.append(rule)
    return broken


def check_document(spec: dict[str, Any]) -> None:
    """Raise ValueError naming every rule the defaulted `spec` document breaks (the models'
    validator: pydantic turns it into a ValidationError)."""
    broken = violations(spec)
    if broken:
        raise ValueError("; ".join(f"spec.{r.field}: {r.message}" for r in broken))
