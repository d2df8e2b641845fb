"""pdx-engine-entrypoint: refuses to start without the EFA provider when asked, else execs.

A fake `fi_info` on PATH stands in for libfabric's; it records that it ran and answers as the
real one does with and without an EFA device.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "images" / "vllm-efa" / "pdx-engine-entrypoint.sh"
SYSTEM_PATH = "/usr/bin:/bin"

FI_INFO_EFA = """#!/bin/sh
echo "$@" >> "$FAKE_FI_INFO_CALLS"
cat <<'OUT'
provider: efa
    fabric: efa
    domain: rdmap79s0-rdm
    version: 124.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap80s0-rdm
    version: 124.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
OUT
"""
FI_INFO_NO_DEVICE = """#!/bin/sh
echo "$@" >> "$FAKE_FI_INFO_CALLS"
echo "fi_getinfo: -61 (No data available)" >&2
exit 61
"""
FI_INFO_TCP_ONLY = """#!/bin/sh
echo "$@" >> "$FAKE_FI_INFO_CALLS"
printf 'provider: tcp\\n    fabric: 10.0.0.0/16\\n    type: FI_EP_RDM\\n'
"""


@pytest.fixture(autouse=True)
def _no_real_fi_info() -> None:
    if shutil.which("fi_info", path=SYSTEM_PATH):
        pytest.skip("a real fi_info is installed in /usr/bin; the 'absent' cases cannot be staged")


class Run:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.calls = tmp / "fi_info.calls"
        self.termination_log = tmp / "termination-log"

    def fi_info(self, script: str) -> None:
        path = self.bin / "fi_info"
        path.write_text(script)
        path.chmod(0o755)

    def __call__(self, *command: str, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {
            "PATH": f"{self.bin}:{SYSTEM_PATH}",
            "FAKE_FI_INFO_CALLS": str(self.calls),
            "PDX_TERMINATION_LOG": str(self.termination_log),
            **env,
        }
        return subprocess.run(
            [str(SCRIPT), *command], env=full_env, capture_output=True, text=True, timeout=30, check=False
        )

    @property
    def fi_info_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    @property
    def termination_message(self) -> str:
        return self.termination_log.read_text() if self.termination_log.exists() else ""


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path)


# The command prints its parent's pid: with exec, that is this test process, not the script.
PRINT_PARENT = ("sh", "-c", "echo parent=$PPID args=$0,$1; exit 7", "first", "second")


def _execed(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode == 7 and f"parent={os.getpid()} args=first,second" in proc.stdout


def test_with_efa_present_it_checks_the_rdm_provider_then_execs_the_command(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="1", FI_PROVIDER="efa")
    assert _execed(proc), proc.stdout + proc.stderr
    assert run.fi_info_calls == ["-p efa -t FI_EP_RDM"]
    assert "EFA provider found (2 RDM endpoint(s))" in proc.stderr
    assert run.termination_message == ""


def test_without_fi_info_it_fails_loudly_with_a_termination_message(run: Run) -> None:
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="1")
    assert proc.returncode == 78 and "parent=" not in proc.stdout
    message = run.termination_message
    assert message.startswith("EFAUnavailable: fi_info is not on PATH")
    assert message.count("\n") == 1
    assert "FATAL" in proc.stderr


def test_without_an_efa_device_it_fails_and_says_what_fi_info_said(run: Run) -> None:
    run.fi_info(FI_INFO_NO_DEVICE)
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="1")
    assert proc.returncode == 78 and "parent=" not in proc.stdout
    message = run.termination_message
    assert message.startswith("EFAUnavailable: fi_info -p efa -t FI_EP_RDM found no EFA provider (exit 61")
    assert "No data available" in message and "vpc.amazonaws.com/efa" in message
    assert message.count("\n") == 1


def test_a_provider_list_without_efa_is_refused(run: Run) -> None:
    run.fi_info(FI_INFO_TCP_ONLY)
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="true")
    assert proc.returncode == 78
    assert run.termination_message.startswith("EFAUnavailable: fi_info -p efa -t FI_EP_RDM listed no efa provider")


def test_fi_provider_set_to_another_provider_is_refused_before_probing(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="1", FI_PROVIDER="tcp")
    assert proc.returncode == 78 and "parent=" not in proc.stdout
    assert run.termination_message.startswith("EFAProviderOverridden: FI_PROVIDER=tcp")
    assert run.fi_info_calls == []


@pytest.mark.parametrize("value", [None, "", "0", "false"])
def test_without_the_requirement_it_execs_without_checking(run: Run, value: str | None) -> None:
    run.fi_info(FI_INFO_NO_DEVICE)
    env = {} if value is None else {"PDX_REQUIRE_EFA": value}
    proc = run(*PRINT_PARENT, FI_PROVIDER="tcp", **env)
    assert _execed(proc), proc.stdout + proc.stderr
    assert run.fi_info_calls == []
    assert run.termination_message == ""


def test_an_unknown_requirement_value_is_refused(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="yes")
    assert proc.returncode == 78
    assert run.termination_message.startswith("InvalidConfig: PDX_REQUIRE_EFA=yes")


def test_no_command_is_refused(run: Run) -> None:
    proc = run()
    assert proc.returncode == 78
    assert run.termination_message.startswith("InvalidConfig: no command")


def test_a_long_multiline_reason_becomes_one_bounded_line(run: Run) -> None:
    noisy = "#!/bin/sh\n" + 'for i in $(seq 400); do echo "fi_getinfo: line $i of noise" >&2; done\nexit 61\n'
    run.fi_info(noisy)
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="1")
    assert proc.returncode == 78
    message = run.termination_message
    assert message.count("\n") == 1 and len(message) <= 1001


def test_default_termination_log_is_the_kubernetes_path() -> None:
    assert "TERMINATION_LOG=${PDX_TERMINATION_LOG:-/dev/termination-log}" in SCRIPT.read_text()


def test_an_unwritable_termination_log_still_fails_with_the_reason_on_stderr(run: Run) -> None:
    proc = run(*PRINT_PARENT, PDX_REQUIRE_EFA="1", PDX_TERMINATION_LOG=str(run.tmp / "missing-dir" / "log"))
    assert proc.returncode == 78
    assert "EFAUnavailable" in proc.stderr and "could not write the termination log" in proc.stderr
