"""``python -m pdx_engine.ipc_probe``: do NIXL reads between two engines on this host run over the
transport they should, and how fast?

Prefill and decode on one host read each other's KV with NIXL over UCX (P->D, and D->P for
bidirectional reuse). On GPUs that must be CUDA IPC: where UCX sees no NVLink (one GPU shared by
both roles, PCIe boxes) it turns cuda_ipc reads off unless UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y, and
the reads still succeed, over TCP at a few GB/s, without a word. This probe does what the
connector does (a target registers memory, an initiator READs it), in two processes with the
engines' environment, asks UCX which lanes it chose (UCX_PROTO_INFO=y), verifies the bytes, and
exits 78 with one line naming the problem when the lanes lack the required transport or the
rate is under the floor. The local runtime runs it before starting GPU engines.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

EX_CONFIG = 78
_LANE = re.compile(r"([a-z][a-z0-9_]*)/")


@dataclass(frozen=True)
class ProbeResult:
    lanes: frozenset[str]
    gbps: float
    verified: bool


def read_lanes(ucx_output: str) -> frozenset[str]:
    """Transports UCX chose for remote memory reads, from its UCX_PROTO_INFO tables.

    Each table is a title (`| initiator intra-node cfg#1 |`, `| remote memory read by ucp_get*
    ... |`), a `Range | Description | Config` header and rows whose last cell names the lanes
    (`cma/memory`, `cuda_ipc/cuda`, `50% on rc_mlx5/mlx5_0:1 and 50% on ...`).
    """
    lanes: set[str] = set()
    reading = False
    for raw in ucx_output.splitlines():
        line = raw[raw.find("|") :] if "|" in raw else ""
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line else []
        if len(cells) == 1:
            reading = "remote memory read" in cells[0] or (reading and "cfg#" not in cells[0])
        elif reading and len(cells) >= 3 and cells[0] != "Range":
            lanes.update(_LANE.findall(cells[-1]))
    return frozenset(lanes)


def verdict(result: ProbeResult, require: str | None, min_gbps: float) -> str | None:
    """The one-line reason to refuse, or None when the reads are as they should be."""
    if not result.verified:
        return "NIXLReadWrong: a NIXL READ between two processes returned wrong bytes"
    if require and require not in result.lanes:
        seen = ", ".join(sorted(result.lanes)) or "none reported"
        return (
            f"NIXLReadNot_{require}: UCX reads between engines on this host use {seen}, not {require}; "
            "set UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (the gpu profile does) and do not narrow UCX_TLS"
        )
    if result.gbps < min_gbps:
        return (
            f"NIXLReadSlow: a NIXL READ between two processes ran at {result.gbps:.1f} GB/s, under "
            f"{min_gbps:g} GB/s (lanes: {', '.join(sorted(result.lanes))})"
        )
    return None


def _wait(path: Path, timeout: float) -> bytes:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"no {path.name} from the other process after {timeout:.0f} s")
        time.sleep(0.02)
    return path.read_bytes()


def _publish(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _side(role: str, folder: Path, dev: str, nbytes: int, reps: int) -> int:
    """One process: `target` serves a pattern, `initiator` READs it and prints GB/s."""
    import torch
    from nixl._api import nixl_agent, nixl_agent_config

    device = "cuda:0" if dev == "cuda" else "cpu"
    n = nbytes // 4
    buf = (torch.arange if role == "target" else torch.zeros)(n, dtype=torch.int32, device=device)
    agent = nixl_agent(role, nixl_agent_config(backends=["UCX"]))
    reg = agent.register_memory(buf)
    _publish(folder / f"{role}.md", agent.get_agent_metadata())
    other = "initiator" if role == "target" else "target"
    peer = agent.add_remote_agent(_wait(folder / f"{other}.md", 120))
    if role == "target":
        _publish(folder / "descs", agent.get_serialized_descs(reg.trim()))
        end = time.monotonic() + 300
        while not agent.check_remote_xfer_done("initiator", b"done"):
            if time.monotonic() > end:
                return 1
            time.sleep(0.005)
        return 0
    remote = agent.deserialize_descs(_wait(folder / "descs", 120))
    best, ok = 0.0, True
    for _ in range(reps):
        if dev == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        handle = agent.initialize_xfer("READ", reg.trim(), remote, peer)
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        best = max(best, nbytes / (time.perf_counter() - start) / 1e9)
        agent.release_xfer_handle(handle)
        ok &= state == "DONE"
    verified = ok and bool(torch.equal(buf, torch.arange(n, dtype=torch.int32, device=device)))
    print(f"pdx-ipc-probe: verified={int(verified)} gbps={best:.2f}", flush=True)
    agent.send_notif(peer, b"done")
    time.sleep(0.2)
    return 0


def probe(
    dev: str = "cuda", mib: int = 256, reps: int = 4, devices: tuple[str, str] | None = None, timeout: float = 240.0
) -> ProbeResult:
    """Run target and initiator as two processes (as two engines are) and read the outcome;
    `devices`: CUDA_VISIBLE_DEVICES of the target (decode's GPUs) and the initiator (prefill's)."""
    env = {**os.environ, "UCX_PROTO_INFO": "y"}
    env_t, env_i = env, env
    if devices is not None:
        env_t, env_i = ({**env, "CUDA_VISIBLE_DEVICES": d} for d in devices)
    with tempfile.TemporaryDirectory(prefix="pdx-ipc-probe-") as tmp:
        base = [sys.executable, "-m", "pdx_engine.ipc_probe", "--dev", dev, "--mib", str(mib), "--reps", str(reps)]
        side = [*base, "--dir", tmp, "--side"]
        target = subprocess.Popen([*side, "target"], env=env_t, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        initiator = subprocess.run(
            [*side, "initiator"], env=env_i, capture_output=True, text=True, timeout=timeout, check=False
        )
        try:
            target.wait(timeout=30)
        except subprocess.TimeoutExpired:
            target.kill()
    out = initiator.stdout + initiator.stderr
    found = re.search(r"pdx-ipc-probe: verified=(\d) gbps=([0-9.]+)", out)
    if initiator.returncode != 0 or found is None:
        tail = " | ".join(out.strip().splitlines()[-5:])
        raise RuntimeError(f"the NIXL read probe failed (exit {initiator.returncode}): {tail}")
    return ProbeResult(read_lanes(out), float(found.group(2)), found.group(1) == "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdx_engine.ipc_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--dev", choices=["cuda", "cpu"], default="cuda", help="where the buffers live (kv_buffer_device)")
    p.add_argument("--mib", type=int, default=256, help="bytes read, in MiB")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--require", default=None, help="a UCX transport the reads must use (default: cuda_ipc on cuda)")
    p.add_argument("--min-gbps", type=float, default=0.0, help="refuse below this rate")
    p.add_argument("--devices", help="CUDA_VISIBLE_DEVICES of the target and the initiator, as T:I (e.g. 1:0)")
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--side", choices=["target", "initiator"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.side:
        assert a.dir is not None
        return _side(a.side, a.dir, a.dev, a.mib << 20, a.reps)
    require = a.require if a.require is not None else ("cuda_ipc" if a.dev == "cuda" else None)
    try:
        target_gpus, _, initiator_gpus = (a.devices or "").partition(":")
        devices = (target_gpus, initiator_gpus) if a.devices else None
        result = probe(a.dev, a.mib, a.reps, devices)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"pdx-ipc-probe: NIXLProbeFailed: {err}", file=sys.stderr)
        return EX_CONFIG
    print(f"pdx-ipc-probe: {a.dev} READ {a.mib} MiB at {result.gbps:.1f} GB/s over {', '.join(sorted(result.lanes))}")
    reason = verdict(result, require or None, a.min_gbps)
    if reason:
        print(f"pdx-ipc-probe: {reason}", file=sys.stderr)
        return EX_CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main())
