"""What the benchmark relies on: fakes a gateway can discover and whose loop lag it can read,
and the kv check's fast form refusing exactly what the slow one refused."""

from __future__ import annotations

import aiohttp

from pdx_router.filters import well_formed_kv
from pdx_router.testing.fake_engine import Cluster, EngineOptions, start_engine


def test_kv_block_groups_refuse_bools_floats_negatives_and_non_lists() -> None:
    ok = {"remote_block_ids": [[0, 1, 2], [], [7], [(1 << 64) - 1]], "remote_num_tokens": 20}
    assert well_formed_kv(ok)
    for groups in (
        [[1, True]],
        [[1, 2.0]],
        [[1, -1]],
        [1, 2],
        [(1, 2)],
        [[1, "2"]],
        [[1, None]],
        [[1 << 40, -(1 << 40)]],
        [[1, [2]]],
        [[1 << 70]],
        [[1, {"a": 2}]],
    ):
        assert not well_formed_kv({**ok, "remote_block_ids": groups}), groups


async def test_a_fake_engine_names_its_model_and_reports_its_loop_lag() -> None:
    # smg learns a worker's model from /v1/models (without it, every turn was "no available
    # workers"); the benchmark reads /lag to tell a slow router from busy fakes.
    _, runner, url = await start_engine(Cluster(), EngineOptions("decode", "decode-0", served_model="Qwen"))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/models") as r:
                assert r.status == 200
                assert [m["id"] for m in (await r.json())["data"]] == ["Qwen"]
            async with s.get(url + "/lag") as r:
                assert r.status == 200
                lag = await r.json()
                assert set(lag) == {"samples", "p99_ms", "max_ms"} and lag["p99_ms"] >= 0
    finally:
        await runner.cleanup()
