"""pdx-engine-entrypoint: refuses to start without the EFA provider when asked, else execs.

A fake `fi_info` on PATH stands in for libfabric's; it records that it ran and answers as the
real one does with and without an EFA device.
"""

from __future__ import annotations

import os
import shutil
import signal
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


# A fake `vllm serve`: NIXL's and uvicorn's start-up lines as the installed packages print
# them (nixl_cu13/_api.py:405 on stdout, uvicorn on stderr), then it serves until SERVE_SECONDS
# pass and exits 3. SIGTERM ends it at once with 143 and a line saying so.
ENGINE = """#!/bin/sh
trap 'echo engine got TERM; exit 143' TERM
echo "INFO 12-01 10:00:00 [base_worker.py:515] Initializing NIXL wrapper"
{backend_line}
echo "INFO 12-01 10:00:09 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000"
echo "INFO:     Application startup complete." >&2
echo "engine serving"
i=0
while [ "$i" -lt "${{SERVE_SECONDS:-0}}" ]; do sleep 1; i=$((i + 1)); done
echo "engine done"
exit 3
"""
LIBFABRIC_LINE = (
    'echo "(EngineCore pid=42) 2026-12-01 10:00:01 NIXL INFO    _api.py:405 Backend LIBFABRIC was instantiated"'
)
UCX_LINE = 'echo "2026-12-01 10:00:01 NIXL INFO    _api.py:405 Backend UCX was instantiated"'
NO_PLUGIN_LINE = (
    'echo "2026-12-01 10:00:01 NIXL WARNING _api.py:252 '
    'Skipping backend registration LIBFABRIC due to the missing plugin."'
)


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
            "PDX_ENGINE_STOP_GRACE": "2",
            **env,
        }
        return subprocess.run(
            [str(SCRIPT), *command], env=full_env, capture_output=True, text=True, timeout=30, check=False
        )

    def engine(self, script: str) -> None:
        path = self.bin / "fake-engine"
        path.write_text(script)
        path.chmod(0o755)

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


def test_with_efa_present_it_checks_the_rdm_provider_then_runs_the_command(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=LIBFABRIC_LINE))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", FI_PROVIDER="efa")
    assert proc.returncode == 3, proc.stdout + proc.stderr
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


def test_a_libfabric_start_keeps_running_and_passes_the_output_through(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=LIBFABRIC_LINE))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", SERVE_SECONDS="2")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the engine's own status
    lines = proc.stdout.splitlines()
    assert lines[-3:] == ["INFO:     Application startup complete.", "engine serving", "engine done"]
    assert any(line.endswith("Backend LIBFABRIC was instantiated") for line in lines)
    assert "NIXL instantiated LIBFABRIC before the server started" in proc.stderr
    assert run.termination_message == ""


@pytest.mark.parametrize("backend_line", [UCX_LINE, 'echo "2026 NIXL INFO _api.py:405 Backend GDS was instantiated"'])
def test_another_backend_is_refused_and_the_engine_stopped(run: Run, backend_line: str) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=backend_line))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", SERVE_SECONDS="20")
    assert proc.returncode == 78, proc.stdout + proc.stderr
    message = run.termination_message
    assert message.startswith("NIXLBackendNotLibfabric: NIXL instantiated a backend other than LIBFABRIC")
    assert "was instantiated" in message and message.count("\n") == 1
    assert "engine serving" not in proc.stdout or "engine got TERM" in proc.stdout
    assert "engine done" not in proc.stdout


def test_a_libfabric_backend_beside_ucx_is_still_refused(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=LIBFABRIC_LINE + "\n" + UCX_LINE))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", SERVE_SECONDS="20")
    assert proc.returncode == 78
    assert "Backend UCX was instantiated" in run.termination_message


def test_a_missing_libfabric_plugin_is_refused(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=NO_PLUGIN_LINE))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", SERVE_SECONDS="20")
    assert proc.returncode == 78
    assert run.termination_message.startswith("NIXLBackendNotLibfabric: NIXL has no LIBFABRIC plugin")


def test_serving_without_the_libfabric_line_is_refused(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line="true"))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", SERVE_SECONDS="20")
    assert proc.returncode == 78, proc.stdout + proc.stderr
    message = run.termination_message
    assert message.startswith("NIXLBackendUnverified: the server started but NIXL never logged")
    assert "Starting vLLM server on" in message and "engine done" not in proc.stdout


@pytest.mark.parametrize("level", ["WARN", "error", "FATAL"])
def test_a_nixl_log_level_that_hides_the_proof_is_refused_before_starting(run: Run, level: str) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=LIBFABRIC_LINE))
    proc = run("fake-engine", PDX_REQUIRE_EFA="1", NIXL_LOG_LEVEL=level)
    assert proc.returncode == 78 and "engine serving" not in proc.stdout
    assert run.termination_message.startswith(f"NIXLBackendUnverified: NIXL_LOG_LEVEL={level} hides")


def test_an_engine_failing_before_the_verdict_keeps_its_status_and_no_reason_is_invented(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine("#!/bin/sh\necho 'ValueError: bad model' >&2\nexit 1\n")
    proc = run("fake-engine", PDX_REQUIRE_EFA="1")
    assert proc.returncode == 1 and "ValueError: bad model" in proc.stdout
    assert run.termination_message == ""


def test_sigterm_reaches_a_watched_engine(run: Run) -> None:
    run.fi_info(FI_INFO_EFA)
    run.engine(ENGINE.format(backend_line=LIBFABRIC_LINE))
    env = {
        "PATH": f"{run.bin}:{SYSTEM_PATH}",
        "FAKE_FI_INFO_CALLS": str(run.calls),
        "PDX_TERMINATION_LOG": str(run.termination_log),
        "PDX_REQUIRE_EFA": "1",
        "SERVE_SECONDS": "60",
    }
    with subprocess.Popen(
        [str(SCRIPT), "fake-engine"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("engine serving"):
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143 and "engine got TERM" in out
    assert run.termination_message == ""
