"""A container's environment and arguments as the kubelet resolves them.

The renderer writes `$(POD_IP)`-style references (downward API, ports); Kubernetes expands
them at container start. The local runtime and the tests expand them the same way here, so
the rendered pod is the only description of how an engine starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubelet expansion: `$(VAR)` -> value when defined, `$$` -> `$`, anything else verbatim."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _REF.sub(sub, text)


def resolve_env(
    container: Mapping[str, Any], fields: Mapping[str, str], secrets: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The container's env in order; `fields` answers fieldRef paths (e.g. `status.podIP`).

    A later variable may reference an earlier one, as in Kubernetes. Secret references resolve
    from `secrets` (key `name/key`) and are left out when absent.
    """
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[name] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source and secrets is not None:
            ref = source["secretKeyRef"]
            value = secrets.get(f"{ref['name']}/{ref['key']}")
            if value is not None:
                env[name] = value
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with references expanded (the image's entrypoint is not modelled)."""
    words = [*container.get("command", []), *container.get("args", [])]
    return [expand(str(w), env) for w in words]
