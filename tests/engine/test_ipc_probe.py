"""The KV read probe: which UCX lanes a NIXL READ between two processes took, and whether to refuse."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdx_engine.ipc_probe import EX_CONFIG, ProbeResult, read_lanes, verdict

# UCX_PROTO_INFO=y of a real CPU run here (NIXL 1.5.1), trimmed: an active-message table over TCP,
# then the remote memory read over CMA.
CPU_RUN = """\
[1796297322.233123] [vm:5402 :0]   +-------------+--------------------+---------------------+
[1796297322.233123] [vm:5402 :0]   | initiator intra-node cfg#1                             |
[1796297322.233123] [vm:5402 :0]   | active message by ucp_am_send*(multi) from host memory |
[1796297322.233123] [vm:5402 :0]   +-------------+--------------------+---------------------+
[1796297322.233123] [vm:5402 :0]   |    Range    |    Description     |       Config        |
[1796297322.233123] [vm:5402 :0]   +-------------+--------------------+---------------------+
[1796297322.233123] [vm:5402 :0]   |     0..8184 | short              | tcp/lo              |
[1796297322.233123] [vm:5402 :0]   +-------------+--------------------+---------------------+
[1796297322.254074] [vm:5402 :0]   +--------+-------------+-------------------------------------------+
[1796297322.254074] [vm:5402 :0]   | initiator intra-node cfg#1                                       |
[1796297322.254074] [vm:5402 :0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1796297322.254074] [vm:5402 :0]   +--------+-------------+-------------------------------------------+
[1796297322.254074] [vm:5402 :0]   | Range  | Description |                  Config                   |
[1796297322.254074] [vm:5402 :0]   +--------+-------------+-------------------------------------------+
[1796297322.254074] [vm:5402 :0]   | 0..inf | zero-copy   | cma/memory                                |
[1796297322.254074] [vm:5402 :0]   +--------+-------------+-------------------------------------------+
pdx-ipc-probe: verified=1 gbps=2.08
[1796297322.488977] [vm:5402 :0]   +------------+--------------------+--------------------+
[1796297322.488977] [vm:5402 :0]   | initiator intra-node cfg#1                           |
[1796297322.488977] [vm:5402 :0]   | active message by ucp_am_send*(egr) from host memory |
[1796297322.488977] [vm:5402 :0]   +------------+--------------------+--------------------+
[1796297322.488977] [vm:5402 :0]   |   Range    |    Description     |       Config       |
[1796297322.488977] [vm:5402 :0]   |   1..16515 | zero-copy          | tcp/lo             |
"""


def test_only_the_remote_memory_read_tables_name_the_lanes() -> None:
    assert read_lanes(CPU_RUN) == frozenset({"cma"})


def test_split_lanes_of_one_row_are_all_read() -> None:
    table = CPU_RUN.replace("cma/memory      ", "50% on cuda_ipc/cuda and 50% on tcp/lo")
    assert read_lanes(table) == frozenset({"cuda_ipc", "tcp"})


def test_reads_without_the_required_transport_are_refused_with_the_fix() -> None:
    reason = verdict(ProbeResult(frozenset({"tcp"}), 3.1, True), "cuda_ipc", 20)
    assert reason is not None and reason.startswith("NIXLReadNot_cuda_ipc: ")
    assert "use tcp, not cuda_ipc; set UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in reason


def test_slow_or_wrong_reads_are_refused_and_good_ones_pass() -> None:
    assert verdict(ProbeResult(frozenset({"cuda_ipc"}), 1900.0, True), "cuda_ipc", 20) is None
    slow = verdict(ProbeResult(frozenset({"cuda_ipc"}), 4.0, True), "cuda_ipc", 20)
    assert slow is not None and slow.startswith("NIXLReadSlow: ")
    wrong = verdict(ProbeResult(frozenset({"cuda_ipc"}), 1900.0, False), "cuda_ipc", 20)
    assert wrong is not None and wrong.startswith("NIXLReadWrong: ")


def test_a_real_nixl_read_between_two_processes_on_cpu_is_verified_and_its_lane_named() -> None:
    pytest.importorskip("nixl._api", reason="needs NIXL (scripts/setup.sh)")
    probe = [sys.executable, "-m", "pdx_engine.ipc_probe", "--dev", "cpu", "--mib", "16", "--reps", "2"]
    ok = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("pdx-ipc-probe: cpu READ 16 MiB at ") and " over " in ok.stdout
    refused = subprocess.run([*probe, "--require", "cuda_ipc"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == EX_CONFIG
    assert "NIXLReadNot_cuda_ipc" in refused.stderr
