"""The comparison of vLLM's benchmark records with pdx's (pure; the real run needs a router)."""

from __future__ import annotations

from typing import Any

from pdx_bench.compat import checks_markdown, compare, renamed, reuse_delta
from pdx_bench.records import VLLM_FIELDS
from pdx_bench.workload import WorkloadSpec, build

from .synth import record


def _vllm(conv: int, turn: int, ttft: float, tokens: int) -> dict[str, Any]:
    rec: dict[str, Any] = dict.fromkeys(VLLM_FIELDS, 0)
    rec.update(ttft_ms=ttft, input_num_turns=2 * turn - 1, input_num_tokens=tokens, output_num_tokens=32,
               conversation_id=f"vllm-c{conv}")  # fmt: skip
    return rec


def _pdx(conv: int, turn: int, ttft: float, tokens: int, reuse: str) -> dict[str, Any]:
    r = record("compat", 1000, turn, ttft, conv=f"c{conv}", prompt=tokens, reuse=reuse)
    r.input_num_turns = 2 * turn - 1
    return r.to_json()


def _pair(ttft_scale: float = 1.0, extra_tokens: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    v, p = [], []
    for c in range(2):
        for t in (1, 2, 3):
            tokens = 1000 + 250 * (t - 1)
            v.append(_vllm(c, t, 100.0 if t == 1 else 40.0, tokens))
            p.append(
                _pdx(c, t, (100.0 if t == 1 else 40.0) * ttft_scale, tokens + extra_tokens, "miss" if t == 1 else "hit")
            )
    return v, p


def _verdicts(checks: list[Any]) -> dict[str, bool | None]:
    return {c.name: c.ok for c in checks}


def test_agreeing_runs_pass() -> None:
    v, p = _pair()
    checks = compare(v, p, conversations=2, turns=3, max_tokens=32, vllm_reuse={"hit": 4, "miss": 2})
    assert all(c.ok for c in checks), checks_markdown(checks)
    assert "| reuse hits (follow-up turns) | 4/4 | 4/4 |" in checks_markdown(checks)


def test_disagreements_are_caught() -> None:
    v, p = _pair(ttft_scale=3.0)
    got = _verdicts(compare(v, p, conversations=2, turns=3, max_tokens=32, vllm_reuse={"hit": 0}))
    assert got["TTFT turn 1 (median ms)"] is False and got["TTFT turns >= 2 (median ms)"] is False
    assert got["reuse hits (follow-up turns)"] is False  # vLLM's conversation ids did not reach the router
    assert got["requests answered"] is True

    v, p = _pair(extra_tokens=400)  # far more than a chat template adds
    assert (
        _verdicts(compare(v, p, conversations=2, turns=3, max_tokens=32, vllm_reuse=None))[
            "input tokens, turn 1 (median)"
        ]
        is False
    )

    v, p = _pair()
    del p[0]["ttft_ms"]
    assert (
        _verdicts(compare(v, p, conversations=2, turns=3, max_tokens=32, vllm_reuse=None)).get("record fields") is False
    )

    v, p = _pair()
    got = _verdicts(compare(v[:-1], p, conversations=2, turns=3, max_tokens=32, vllm_reuse=None))
    assert got["requests answered"] is False and got["turns per request"] is False
    assert got["reuse via conversation_id"] is None  # no router stats: not judged


def test_reuse_delta_and_renaming() -> None:
    assert reuse_delta({"reuse": {"hit": 3, "miss": 1}}, {"reuse": {"hit": 7, "miss": 3}}) == {"hit": 4, "miss": 2}
    assert reuse_delta(None, {"reuse": {}}) is None
    w = build(WorkloadSpec(prefix_tokens=20, turns=2, conversations=2, system_role=False))
    r = renamed(w, "vllm-")
    assert [c.conversation_id for c in r.conversations] == [f"vllm-{c.conversation_id}" for c in w.conversations]
    assert [c.turns for c in r.conversations] == [c.turns for c in w.conversations]
