"""Status (pure): what was observed -> the status block, with conditions a person can act on.

Ready means "requests can be served": the router is available and the generation the router
pairs has a ready prefill and decode. Progressing covers everything still moving (rollout,
scale, start-up); Degraded covers what will not fix itself (rejected edit, failed apply,
pods crash-looping). Counts come from pods, the ground truth, not from controller status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pdx.controller.rollout import PodView, in_rollout, pairs
from pdx.render.meta import ROLES
from pdx.spec import CONDITIONS, Condition, DisaggregatedInferenceStatus, ReuseStatus, RoleStatus

CONDITION_TYPES = tuple(CONDITIONS)

# First word of the termination message the serving image's entrypoint writes when it
# refuses to start without EFA (rather than let NIXL fall back to TCP silently): no EFA
# provider, FI_PROVIDER naming another one, NIXL instantiating a backend other than LIBFABRIC
# (or lacking its plugin), or the server starting without NIXL having logged LIBFABRIC.
EFA_REASONS = frozenset({"EFAUnavailable", "EFAProviderOverridden", "NIXLBackendNotLibfabric", "NIXLBackendUnverified"})

# Container waiting reasons that mean a pod will not become ready without someone acting.
FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class Observation:
    """Everything status depends on; built by `reconcile` from the API."""

    generation: int | None
    config_hash: str | None  # the hash in force (the previous one while the spec is invalid)
    desired: dict[str, int]  # prefill, decode, router
    pods: Sequence[PodView] = ()
    published: str | None = None  # the generation in the router's endpoints file
    invalid: str | None = None  # SpecError message
    apply_error: str | None = None
    router_address: str | None = None
    bidirectional: bool | None = None
    reuse: ReuseStatus | None = None
    extra: dict[str, str] = field(default_factory=dict)


def role_status(pods: Sequence[PodView], role: str, desired: int, config_hash: str | None) -> RoleStatus:
    mine = [p for p in pods if p.role == role and not p.terminating]
    ready = sum(1 for p in mine if p.serving)
    if role in ROLES:
        updated = sum(1 for p in mine if config_hash is not None and p.generation == config_hash)
    else:  # the router has no engine config generation; its own rollout is the Deployment's
        updated = ready
    draining = sum(1 for p in pods if p.role == role and p.draining)
    return RoleStatus(ready=ready, desired=desired, updated=updated, draining=draining, summary=f"{ready}/{desired}")


def _available(kind: str, rs: RoleStatus) -> tuple[bool, str, str]:
    if rs.desired == 0:
        return False, "ScaledToZero", f"{kind} has 0 replicas desired"
    if rs.ready == 0:
        return False, "NoneReady", f"no {kind} pod is ready (0/{rs.desired})"
    if rs.ready < rs.desired:
        return True, "PartiallyReady", f"{rs.ready}/{rs.desired} {kind} pods ready"
    return True, "AllReady", f"{rs.ready}/{rs.desired} {kind} pods ready"


def _cond(
    type_: str, ok: bool, reason: str, message: str, generation: int | None, previous: dict[str, Condition], now: str
) -> Condition:
    status: Literal["True", "False"] = "True" if ok else "False"
    before = previous.get(type_)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def held_kv_pinned(reuse: ReuseStatus | None) -> tuple[bool, str, str]:
    """Whether a decode keeps held KV as a hard pin (no valve), from the router's last poll."""
    if reuse is None or reuse.valve_off is None:
        return False, "NotObserved", "the router has not yet polled decodes' held KV"
    if reuse.valve_off:
        return (
            True,
            "ValveOff",
            f"{reuse.valve_off} decode(s) keep held KV until a read or the TTL: kvTransfer.releaseUnderPressure"
            " is false, or the engine runs without pdx's plugin or with a vLLM it could not patch (its log says"
            " 'pdx plugin'); new work waits when their KV fills",
        )
    return False, "Yields", "every decode releases held KV under memory pressure"


def compute(obs: Observation, previous: DisaggregatedInferenceStatus | None, now: str) -> DisaggregatedInferenceStatus:
    """The whole status block; lastTransitionTime only moves when a condition's status does."""
    prev = {c.type: c for c in (previous.conditions if previous else [])}
    h = obs.config_hash
    roles = {r: role_status(obs.pods, r, obs.desired.get(r, 0), h) for r in (*ROLES, "router")}
    avail = {
        "prefill": _available("prefill", roles["prefill"]),
        "decode": _available("decode", roles["decode"]),
        "router": _available("router", roles["router"]),
    }
    serving_pairs = pairs(obs.pods, obs.published) if obs.published else 0

    # Ready: a pair of the published generation plus a router.
    if serving_pairs and avail["router"][0]:
        ready = (True, "Serving", f"{serving_pairs} prefill/decode pair(s) of config {obs.published} behind the router")
    elif not avail["router"][0]:
        ready = (False, "RouterUnavailable", avail["router"][2])
    elif roles["prefill"].desired == 0 or roles["decode"].desired == 0:
        ready = (False, "ScaledToZero", "prefill or decode has 0 replicas desired")
    else:
        ready = (False, "NoEnginePair", "no ready prefill and decode of one config generation yet")

    # Progressing: anything not yet at its desired, updated state.
    rolling = h is not None and (in_rollout(obs.pods, h) or (obs.published is not None and obs.published != h))
    behind = [
        f"{r} {roles[r].ready}/{roles[r].desired} ready" + (f", {roles[r].updated} updated" if r in ROLES else "")
        for r in (*ROLES, "router")
        if roles[r].ready != roles[r].desired or (r in ROLES and roles[r].updated != roles[r].desired)
    ]
    draining = sorted(p.name for p in obs.pods if p.draining)
    if rolling:
        progressing = (True, "RollingOut", f"moving prefill and decode to config {h}: " + "; ".join(behind))
    elif draining:
        why = "waiting until no conversation's KV is left there (at most the router's entry deadline)"
        progressing = (True, "Draining", f"{', '.join(draining)} draining: {why}")
    elif behind:
        progressing = (True, "Scaling", "; ".join(behind))
    else:
        progressing = (False, "Complete", f"all pods ready on config {h}")

    # Degraded: needs a person.
    failing = sorted(f"{p.name} ({p.waiting_reason})" for p in obs.pods if p.waiting_reason in FAILING_REASONS)
    if obs.invalid:
        degraded = (True, "InvalidSpec", "the last edit was rejected; the fleet keeps running the previous config")
    elif obs.apply_error:
        degraded = (True, "ApplyFailed", obs.apply_error)
    elif failing:
        degraded = (True, "PodsFailing", ", ".join(failing))
    else:
        degraded = (False, "AsExpected", "")

    invalid = (True, "InvalidSpec", obs.invalid) if obs.invalid else (False, "Valid", "")

    efa_failures = sorted(
        (p.termination.split(":", 1)[0], p.name, p.termination)
        for p in obs.pods
        if p.termination and p.termination.split(":", 1)[0] in EFA_REASONS
    )
    if efa_failures:
        efa = (False, efa_failures[0][0], "; ".join(f"{name}: {msg}" for _, name, msg in efa_failures))
        if not degraded[0]:
            degraded = (True, efa_failures[0][0], efa[2])
    else:
        efa = (True, "NoFailureReported", "no engine refused to start for want of EFA")

    reuse = obs.reuse if obs.reuse is not None else (previous.reuse if previous else None)
    table = {
        "Ready": ready,
        "PrefillAvailable": avail["prefill"],
        "DecodeAvailable": avail["decode"],
        "RouterAvailable": avail["router"],
        "Progressing": progressing,
        "Degraded": degraded,
        "InvalidSpec": invalid,
        "EFAAvailable": efa,
        "HeldKvPinned": held_kv_pinned(reuse),
    }
    conditions = [_cond(t, *table[t], obs.generation, prev, now) for t in CONDITION_TYPES]
    return DisaggregatedInferenceStatus(
        observed_generation=obs.generation,
        config_hash=h,
        ready="True" if ready[0] else "False",
        prefill=roles["prefill"],
        decode=roles["decode"],
        router=roles["router"],
        router_address=obs.router_address,
        bidirectional=obs.bidirectional,
        reuse=reuse,
        conditions=conditions,
    )
