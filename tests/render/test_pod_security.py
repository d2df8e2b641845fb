"""Engine and router pods run with the least the software allows; the HF token is a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pdx.render import render
from pdx.render.engines import HF_TOKEN_FILE
from tests.render.test_render import by_kind, target


def engine_pod(**changes: Any) -> dict[str, Any]:
    pod: dict[str, Any] = by_kind(render(target(**changes)), "StatefulSet")["qwen3-32b-prefill"]["spec"]["template"][
        "spec"
    ]
    return pod


def test_efa_engines_keep_only_the_capabilities_memory_registration_needs() -> None:
    sc = engine_pod()["containers"][0]["securityContext"]  # p5en: EFA
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK", "SYS_RESOURCE"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc


def test_engines_without_efa_keep_no_capability() -> None:
    sc = engine_pod(spec__placement__instanceType="cpu")["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_hf_token_is_a_read_only_secret_file_that_hf_token_path_names() -> None:
    pod = engine_pod()  # the seed example has hfTokenSecret: {name: hf-token}
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert "HF_TOKEN" not in env
    assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in container["env"])
    assert env["HF_TOKEN_PATH"]["value"] == HF_TOKEN_FILE
    mount = next(m for m in container["volumeMounts"] if m["name"] == "hf-token")
    assert mount["readOnly"] is True and f"{mount['mountPath']}/token" == HF_TOKEN_FILE
    volume = next(v for v in pod["volumes"] if v["name"] == "hf-token")
    assert volume["secret"] == {
        "secretName": "hf-token",
        "items": [{"key": "token", "path": "token"}],
        "defaultMode": 0o400,
    }
    assert "hf-token" not in {v["name"] for v in engine_pod(spec__hfTokenSecret=None)["volumes"]}


def test_huggingface_hub_in_the_engine_reads_the_token_from_the_mounted_secret(tmp_path: Path) -> None:
    """The rendered env, with the secret volume at a local directory, gives huggingface_hub
    (the installed one, which vLLM downloads with) the Secret's token."""
    container = engine_pod()["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "hf-token")
    (tmp_path / "token").write_text("hf_fromthesecret\n")  # what the kubelet writes for items: key -> token
    rendered = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_TOKEN_PATH"] = rendered["HF_TOKEN_PATH"].replace(mount["mountPath"], str(tmp_path), 1)
    env["HF_HOME"] = str(tmp_path / "home")
    out = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub; print(huggingface_hub.get_token())"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert out.stdout.strip() == "hf_fromthesecret"


def test_router_runs_as_a_non_root_user_and_group_with_nothing_extra() -> None:
    pod = by_kind(render(target()), "Deployment")["qwen3-32b-router"]["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532 and sc["runAsGroup"] == 65532
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
