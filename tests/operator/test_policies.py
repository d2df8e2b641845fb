"""Pure policies: status conditions, the one-generation rollout rule, TTL advice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdx.controller import advice, rollout, status
from pdx.controller.rollout import PodView
from pdx.spec import ROUTER_TTL_MARGIN_SECONDS, Condition, DisaggregatedInferenceStatus

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def pods(role: str, gen: str | None, n: int, *, ready: bool = True, start: int = 0) -> list[PodView]:
    return [
        PodView(name=f"{role}-{gen}-{i}", role=role, generation=gen, ready=ready, ip=f"10.0.0.{i + 1}")
        for i in range(start, start + n)
    ]


def fleet(gen: str, p: int, d: int, r: int = 1, *, desired: tuple[int, int, int] = (2, 2, 1)) -> status.Observation:
    return status.Observation(
        generation=3,
        config_hash=gen,
        desired={"prefill": desired[0], "decode": desired[1], "router": desired[2]},
        pods=[*pods("prefill", gen, p), *pods("decode", gen, d), *pods("router", None, r)],
        published=gen,
        router_address="http://demo-router.ns.svc:8000",
        bidirectional=True,
    )


def conds(st: DisaggregatedInferenceStatus) -> dict[str, Condition]:
    return {c.type: c for c in st.conditions}


# --- status ---------------------------------------------------------------------------------


def test_all_ready_is_ready_and_not_progressing() -> None:
    st = status.compute(fleet("aaa", 2, 2), None, NOW)
    c = conds(st)
    assert st.ready == "True" and c["Ready"].reason == "Serving"
    assert c["Progressing"].status == "False" and c["Degraded"].status == "False"
    assert c["InvalidSpec"].status == "False"
    assert st.prefill is not None and st.prefill.summary == "2/2" and st.prefill.updated == 2
    assert st.observed_generation == 3 and st.config_hash == "aaa"
    assert all(x.observed_generation == 3 for x in st.conditions)
    assert [x.type for x in st.conditions] == list(status.CONDITION_TYPES)


def test_partial_readiness_serves_but_progresses() -> None:
    st = status.compute(fleet("aaa", 1, 2), None, NOW)
    c = conds(st)
    assert c["Ready"].status == "True"  # one pair is enough to serve
    assert c["PrefillAvailable"].status == "True" and c["PrefillAvailable"].reason == "PartiallyReady"
    assert c["Progressing"].status == "True" and c["Progressing"].reason == "Scaling"
    assert "prefill 1/2 ready" in c["Progressing"].message
    assert st.prefill is not None and st.prefill.summary == "1/2"


def test_no_decode_ready_is_not_ready() -> None:
    st = status.compute(fleet("aaa", 2, 0), None, NOW)
    c = conds(st)
    assert st.ready == "False" and c["Ready"].reason == "NoEnginePair"
    assert c["DecodeAvailable"].status == "False" and c["DecodeAvailable"].reason == "NoneReady"


def test_router_down_is_not_ready() -> None:
    st = status.compute(fleet("aaa", 2, 2, r=0), None, NOW)
    assert conds(st)["Ready"].reason == "RouterUnavailable"
    assert conds(st)["RouterAvailable"].status == "False"


def test_rollout_is_progressing_with_updated_counts() -> None:
    obs = fleet("new", 0, 0)
    obs = status.Observation(
        **{**obs.__dict__, "pods": [*pods("prefill", "old", 2), *pods("decode", "old", 2), *pods("router", None, 1)],
           "published": "old"}
    )  # fmt: skip
    st = status.compute(obs, None, NOW)
    c = conds(st)
    assert c["Ready"].status == "True"  # the old generation keeps serving
    assert c["Progressing"].reason == "RollingOut" and "new" in c["Progressing"].message
    assert st.prefill is not None and (st.prefill.ready, st.prefill.updated) == (2, 0)


def test_invalid_spec_degrades_but_keeps_fleet_status() -> None:
    obs = status.Observation(**{**fleet("aaa", 2, 2).__dict__, "invalid": "spec.prefill.replicas: must be >= 0"})
    st = status.compute(obs, None, NOW)
    c = conds(st)
    assert c["InvalidSpec"].status == "True" and "replicas" in c["InvalidSpec"].message
    assert c["Degraded"].status == "True" and c["Degraded"].reason == "InvalidSpec"
    assert c["Ready"].status == "True"  # the running fleet still serves


def test_crashlooping_pod_degrades() -> None:
    obs = fleet("aaa", 1, 2)
    bad = PodView(
        name="demo-prefill-1", role="prefill", generation="aaa", ready=False, waiting_reason="CrashLoopBackOff"
    )
    st = status.compute(status.Observation(**{**obs.__dict__, "pods": [*obs.pods, bad]}), None, NOW)
    assert conds(st)["Degraded"].reason == "PodsFailing"
    assert "demo-prefill-1 (CrashLoopBackOff)" in conds(st)["Degraded"].message


def test_transition_time_moves_only_on_status_change() -> None:
    first = status.compute(fleet("aaa", 1, 2), None, NOW)
    second = status.compute(fleet("aaa", 2, 2), first, LATER)
    assert conds(second)["Ready"].last_transition_time == NOW  # stayed True
    assert conds(second)["Progressing"].last_transition_time == LATER  # True -> False


def test_scaled_to_zero() -> None:
    st = status.compute(fleet("aaa", 0, 0, desired=(0, 0, 1)), None, NOW)
    assert conds(st)["PrefillAvailable"].reason == "ScaledToZero"
    assert conds(st)["Ready"].reason == "ScaledToZero"


# --- rollout ---------------------------------------------------------------------------------


def test_old_generation_serves_until_new_has_a_pair() -> None:
    ps = [*pods("prefill", "old", 2), *pods("decode", "old", 2), *pods("prefill", "new", 1)]
    gen, eps = rollout.endpoints(ps, "new")
    assert gen == "old"
    assert {e.generation for e in eps} == {"old"} and len(eps) == 4


def test_switches_when_new_capacity_matches_old() -> None:
    ps = [*pods("prefill", "old", 1), *pods("decode", "old", 1), *pods("prefill", "new", 1), *pods("decode", "new", 1)]
    gen, eps = rollout.endpoints(ps, "new")
    assert gen == "new" and {e.generation for e in eps} == {"new"}
    assert sorted(e.role for e in eps) == ["decode", "prefill"]


def test_keeps_larger_old_generation_while_new_is_smaller() -> None:
    ps = [*pods("prefill", "old", 3), *pods("decode", "old", 3), *pods("prefill", "new", 1), *pods("decode", "new", 1)]
    assert rollout.choose_generation(ps, "new") == "old"


def test_unready_and_terminating_pods_are_not_published() -> None:
    ps = [
        *pods("prefill", "g", 1),
        *pods("decode", "g", 1),
        *pods("decode", "g", 1, ready=False, start=5),
        PodView(name="t", role="prefill", generation="g", ready=True, ip="10.0.0.9", terminating=True),
    ]
    gen, eps = rollout.endpoints(ps, "g")
    assert gen == "g" and [e.name for e in eps] == ["decode-g-0", "prefill-g-0"]


def test_a_decode_on_its_way_out_is_published_as_draining_while_it_still_answers() -> None:
    leaving = PodView(name="decode-g-1", role="decode", generation="g", ready=True, ip="10.0.0.8", terminating=True)
    gone_quiet = replace(leaving, name="decode-g-2", ready=False)
    old = replace(leaving, name="decode-old-0", generation="old")  # another generation: its KV is no use
    _, eps = rollout.endpoints([*pods("prefill", "g", 1), *pods("decode", "g", 1), leaving, gone_quiet, old], "g")
    assert [(e.name, e.draining) for e in eps] == [("decode-g-0", False), ("decode-g-1", True), ("prefill-g-0", False)]


def test_a_scale_down_waiting_for_a_drain_says_so_in_status() -> None:
    obs = fleet("g", 2, 1, desired=(2, 1, 1))
    leaving = PodView(name="decode-g-1", role="decode", generation="g", ready=True, ip="10.0.0.8", terminating=True)
    st = status.compute(replace(obs, pods=[*obs.pods, leaving]), None, "t")
    assert st.decode is not None and st.decode.draining == 1 and st.decode.summary == "1/1"
    progressing = conds(st)["Progressing"]
    assert (progressing.status, progressing.reason) == ("True", "Draining")
    assert progressing.message.startswith("decode-g-1 draining: waiting until no conversation's KV is left there")
    done = status.compute(obs, None, "t")
    assert done.decode is not None and done.decode.draining == 0 and conds(done)["Progressing"].status == "False"


def test_no_pods_publishes_nothing_for_target() -> None:
    assert rollout.endpoints([], "g") == ("g", [])


# --- advice -----------------------------------------------------------------------------------


def test_ttl_covers_p95_plus_router_margin() -> None:
    ttl = advice.recommend_ttl(400.0, 100)
    assert ttl is not None
    assert ttl >= 400 * advice.HEADROOM + ROUTER_TTL_MARGIN_SECONDS
    assert ttl % advice.STEP_SECONDS == 0
    assert ttl == 480  # 400 * 1.1 + 30 = 470 -> next 30 s step


def test_ttl_needs_enough_samples() -> None:
    assert advice.recommend_ttl(400.0, advice.MIN_SAMPLES - 1) is None
    assert advice.recommend_ttl(None, 1000) is None


@pytest.mark.parametrize(("p95", "expected"), [(1.0, advice.FLOOR_SECONDS), (10_000.0, advice.CAP_SECONDS)])
def test_ttl_is_clamped(p95: float, expected: int) -> None:
    assert advice.recommend_ttl(p95, 100) == expected


def test_reuse_status_from_router_stats() -> None:
    stats = {
        "reuse": {"hit": 30, "miss": 50, "expired": 6, "declined": 2, "prefix_mismatch": 1, "below_threshold": 1},
        "reusedTokens": 123456,
        "entries": 12,
        "interTurnGapSeconds": {"count": 40, "p50": 20.0, "p95": 100.0, "max": 900.0},
    }
    r = advice.reuse_status(stats)
    assert r is not None
    assert r.hits == 30 and r.expired == 6
    assert r.hit_rate == 0.75  # 30 of the 40 turns that had an entry; misses had none
    assert r.recommended_ttl_seconds == 150  # 100 * 1.1 + 30 = 140 -> 150


def test_local_turns_count_as_reuse_in_the_hit_rate() -> None:
    stats = {"reuse": {"hit": 10, "local": 20, "miss": 5, "expired": 10}}
    r = advice.reuse_status(stats)
    assert r is not None and r.hits == 30 and r.hit_rate == 0.75  # 30 of the 40 with an entry


def test_turns_released_under_pressure_show_in_status_and_lower_the_hit_rate() -> None:
    stats = {"reuse": {"hit": 20, "released": 10, "miss": 5, "expired": 10}}
    r = advice.reuse_status(stats)
    assert r is not None and r.released == 10 and r.hit_rate == 0.5  # 20 of the 40 with an entry


def test_decodes_without_the_valve_show_as_a_held_kv_pinned_condition() -> None:
    stats = {"heldKv": {"decodes": 2, "valveOff": 1, "heldBlocks": 40, "capacityBlocks": 80, "waited": 3}}
    r = advice.reuse_status(stats)
    assert r is not None and (r.valve_off, r.waited) == (1, 3)
    c = conds(status.compute(replace(fleet("h1", 2, 2), reuse=r), None, NOW))["HeldKvPinned"]
    assert (c.status, c.reason) == ("True", "ValveOff")
    assert "1 decode(s)" in c.message and "releaseUnderPressure" in c.message
    yields = advice.reuse_status({"heldKv": {"decodes": 2}})
    c = conds(status.compute(replace(fleet("h1", 2, 2), reuse=yields), None, NOW))["HeldKvPinned"]
    assert (c.status, c.reason) == ("False", "Yields")


def test_before_the_router_polled_decodes_held_kv_is_not_observed() -> None:
    r = advice.reuse_status({"reuse": {"hit": 1}})
    assert r is not None and r.valve_off is None
    c = conds(status.compute(replace(fleet("h1", 2, 2), reuse=r), None, NOW))["HeldKvPinned"]
    assert (c.status, c.reason) == ("False", "NotObserved")


def test_reuse_status_tolerates_empty_stats() -> None:
    r = advice.reuse_status({})
    assert r is not None
    assert r.hit_rate is None and r.hits == 0 and r.recommended_ttl_seconds is None


def test_an_engine_refusing_to_start_without_efa_is_a_condition_a_person_sees() -> None:
    obs = fleet("h1", 2, 2)
    refused = PodView(
        name="demo-decode-1",
        role="decode",
        generation="h1",
        ready=False,
        waiting_reason="CrashLoopBackOff",
        termination="EFAUnavailable: fi_info -p efa found no EFA provider; NIXL would fall back to TCP",
    )
    broken = status.compute(replace(obs, pods=[*obs.pods, refused]), None, NOW)
    c = conds(broken)
    assert (c["EFAAvailable"].status, c["EFAAvailable"].reason) == ("False", "EFAUnavailable")
    assert "demo-decode-1" in c["EFAAvailable"].message and "TCP" in c["EFAAvailable"].message
    assert c["Degraded"].status == "True"
    healthy = conds(status.compute(obs, None, NOW))
    assert (healthy["EFAAvailable"].status, healthy["Degraded"].status) == ("True", "False")


@pytest.mark.parametrize(
    ("reason", "detail"),
    [
        ("NIXLBackendNotLibfabric", "NIXL instantiated a backend other than LIBFABRIC (UCX on EFA runs over TCP)"),
        ("NIXLBackendUnverified", "the server started but NIXL never logged 'Backend LIBFABRIC was instantiated'"),
    ],
)
def test_an_engine_whose_nixl_does_not_run_libfabric_is_an_efa_condition(reason: str, detail: str) -> None:
    obs = fleet("h1", 2, 2)
    refused = PodView(
        name="demo-prefill-0",
        role="prefill",
        generation="h1",
        ready=False,
        waiting_reason="CrashLoopBackOff",
        termination=f"{reason}: {detail}",
    )
    c = conds(status.compute(replace(obs, pods=[*obs.pods, refused]), None, NOW))
    assert (c["EFAAvailable"].status, c["EFAAvailable"].reason) == ("False", reason)
    assert c["EFAAvailable"].message == f"demo-prefill-0: {reason}: {detail}"
    assert c["Degraded"].status == "True" and "demo-prefill-0" in c["Degraded"].message


def test_an_unrelated_termination_message_is_no_efa_condition() -> None:
    obs = fleet("h1", 2, 2)
    crashed = PodView(
        name="demo-decode-0",
        role="decode",
        generation="h1",
        ready=False,
        waiting_reason="CrashLoopBackOff",
        termination="InvalidConfig: no command given to run",
    )
    c = conds(status.compute(replace(obs, pods=[*obs.pods, crashed]), None, NOW))
    assert (c["EFAAvailable"].status, c["EFAAvailable"].reason) == ("True", "NoFailureReported")


def test_pod_view_reads_the_last_termination_message() -> None:
    from pdx.controller.reconcile import pod_view

    pod = {
        "metadata": {"name": "demo-prefill-0", "labels": {"pdx.dev/role": "prefill", "pdx.dev/config-hash": "h1"}},
        "status": {
            "containerStatuses": [
                {
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 78, "message": "EFAUnavailable: no efa provider\n"}},
                }
            ]
        },
    }
    view = pod_view(pod)
    assert (view.termination, view.waiting_reason) == ("EFAUnavailable: no efa provider", "CrashLoopBackOff")


def test_reuse_status_is_none_for_an_answer_that_is_not_the_stats_document() -> None:
    assert advice.reuse_status({"reuse": {"hit": "4"}}) is None  # a string is no count
