"""A real vLLM prefill + decode pair (NIXL, bidirectional KV) for end-to-end tests.

Session-scoped because an engine takes about a minute to start on 2 cores and ~4.6 GB of
memory: every test in tests/engines shares one pair. Tests that use it are marked
``@pytest.mark.engines``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 420.0
DECODER_TTL_S = 480


@dataclass(frozen=True)
class Engine:
    role: str
    url: str
    side_channel_port: int
    log: Path
    process: subprocess.Popen[bytes]


@dataclass(frozen=True)
class EnginePair:
    model: Path
    prefill: Engine
    decode: Engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kv_transfer_config(role: str, engine_id: str) -> str:
    return json.dumps(
        {
            "kv_connector": "NixlConnector",
            "kv_role": role,
            "kv_buffer_device": "cpu",
            "engine_id": engine_id,
            "kv_load_failure_policy": "fail",
            "kv_connector_extra_config": {
                "backends": ["UCX"],
                "bidirectional_kv_xfer": True,
                "decoder_kv_blocks_ttl": DECODER_TTL_S,
                "kv_recompute_threshold": 64,
            },
        }
    )


def _start(role: str, model: Path, cpu: int, logdir: Path) -> Engine:
    port, side = _free_port(), _free_port()
    producer = role == "prefill"
    argv = [
        str(model), "--served-model-name", "pdx", "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--dtype", "float32",
        "--kv-transfer-config",
        kv_transfer_config("kv_producer" if producer else "kv_consumer", f"{role}-0"),
    ]
    if producer:
        argv.append("--no-enable-prefix-caching")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
    }
    log = logdir / f"{role}.log"
    with log.open("wb") as out:
        # Own session: teardown kills the whole group (API server, EngineCore, Worker).
        proc = subprocess.Popen(
            [sys.executable, "-m", "pdx.vllm_serve", *argv],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    return Engine(role, f"http://127.0.0.1:{port}", side, log, proc)


def _healthy(engine: Engine) -> bool:
    try:
        with urllib.request.urlopen(engine.url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _stop(engine: Engine) -> None:
    if engine.process.poll() is not None:
        return
    try:
        os.killpg(engine.process.pid, signal.SIGTERM)
        engine.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(engine.process.pid, signal.SIGKILL)
        engine.process.wait(timeout=30)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def engine_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePair]:
    """Prefill (CPU 0) + decode (CPU 1) serving the tiny model with seeded weights."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"vLLM is not importable ({exc}); run scripts/setup.sh for the engine extra")
    from pdx.localmodel import build_local_model

    cache = Path(os.environ.get("PDX_MODEL_CACHE", Path.home() / ".cache" / "pdx" / "models"))
    model = build_local_model(cache, "tiny", weights=True)
    logdir = tmp_path_factory.mktemp("engines")
    engines = [_start("prefill", model, 0, logdir), _start("decode", model, 1, logdir)]
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for engine in engines:
            while not _healthy(engine):
                if engine.process.poll() is not None:
                    tail = engine.log.read_text(errors="replace")[-3000:]
                    pytest.fail(f"{engine.role} engine exited ({engine.process.returncode}):\n{tail}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{engine.role} engine not healthy after {STARTUP_TIMEOUT_S}s")
                time.sleep(1)
        yield EnginePair(model, engines[0], engines[1])
    finally:
        for engine in engines:
            _stop(engine)
