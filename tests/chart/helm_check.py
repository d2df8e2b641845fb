"""Lint and install the chart with the real Helm library (helm-sdkpy, Helm v4), offline.

Runs in `.venv-helm` (Python 3.12; see scripts/setup-helm-env.sh), not in the project's
venv: the main test suite calls it as a subprocess and reads its JSON.

    .venv-helm/bin/python tests/chart/helm_check.py CHART < cases.json > results.json

cases.json: {"cases": {"<name>": {"values": {...}, "namespace": "...", "release": "..."}}}

For each case:
- lint: Helm's lint of a copy of the chart whose values.yaml holds the case's values merged
  over the defaults (the library's lint takes no values of its own). It renders every
  template and checks the values against values.schema.json.
- install: Helm's install action with the case's values (schema validation on) against a
  kmock Kubernetes emulator on loopback, with Helm's in-memory release storage
  (HELM_DRIVER=memory, set by the caller). The emulator reports Kubernetes 1.37, serves the
  built-in API discovery, and, like an API server, starts serving a CRD's kinds once the CRD
  is created, so the chart's custom objects map too. What Helm sent is read back from it.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import kmock
import yaml

helm: Any = importlib.import_module("helm_sdkpy")

SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
KUBE_VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0", "platform": "linux/amd64"}
CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


class FakeApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with a 1.37 version, core discovery fixed, and CRDs that register."""

    async def _serve_server_version(self, request: kmock.Request) -> Any:
        return dict(KUBE_VERSION)

    async def _serve_version(self, request: kmock.Request) -> Any:
        doc = cast(dict[str, Any], await super()._serve_version(request))
        # kmock 0.8 names the core group-version "/v1"; client-go then finds no core kinds.
        doc["groupVersion"] = doc["groupVersion"].lstrip("/")
        return doc

    async def _handle(self, request: kmock.Request) -> Any:
        response = await super()._handle(request)
        if request.resource == CRD_RESOURCE and request.action == kmock.action.CREATE:
            self._register_crd(request.data)
        return response

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec, names = crd["spec"], crd["spec"]["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            subresources = set(version.get("subresources", {}))
            self.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular", names["kind"].lower()),
                namespaced=spec["scope"] == "Namespaced",
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
                shortnames=set(names.get("shortNames", [])),
                categories=set(names.get("categories", [])),
                subresources=subresources,
            )
        established = [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
        ]
        key = (CRD_RESOURCE, None, crd["metadata"]["name"])
        self.objects[key].patch({"status": {"conditions": established, "acceptedNames": names}})


def kubeconfig(port: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "kmock", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
            "current-context": "kmock",
        }
    )


def merged(base: Any, override: Any) -> Any:
    """Helm's coalescing of user values over the chart's: maps merge, the rest replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = copy.deepcopy(base)
        for key, value in override.items():
            out[key] = merged(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def lint(chart: Path, values: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        copy_dir = Path(tmp) / chart.name
        shutil.copytree(chart, copy_dir)
        defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
        (copy_dir / "values.yaml").write_text(yaml.safe_dump(merged(defaults, values), sort_keys=False))
        result = asyncio.run(helm.Lint(helm.Configuration()).run(str(copy_dir)))
    # Helm's lint errors reach Python as empty objects (Go errors marshal to {}): only the
    # severity and the file are known.
    messages = [
        {"severity": SEVERITY.get(m["Severity"], str(m["Severity"])), "path": m["Path"]} for m in result["Messages"]
    ]
    return {"messages": messages, "errors": sum(m["severity"] == "ERROR" for m in messages)}


async def install(chart: Path, case: dict[str, Any]) -> dict[str, Any]:
    async with FakeApiServer() as api, kmock.Server(api) as server:
        api.resources.load_bundled()
        config = helm.Configuration(namespace=case.get("namespace", "default"), kubeconfig=kubeconfig(server.port))
        out: dict[str, Any] = {"ok": False, "error": None, "manifest": "", "notes": "", "objects": []}
        try:
            release = await helm.Install(config).run(
                case.get("release", "pdx"),
                str(chart),
                values=case.get("values") or None,
                wait=False,
                timeout=60,
            )
        except helm.HelmError as err:
            out["error"] = str(err)
        else:
            out.update(ok=True, manifest=release.get("manifest", ""), notes=release.get("info", {}).get("notes", ""))
        for (resource, namespace, name), obj in api.objects.items():
            if not obj.deleted:
                gvr = "/".join(p for p in (resource.group, resource.version, resource.plural) if p)
                out["objects"].append({"resource": gvr, "namespace": namespace, "name": name, "object": obj.raw})
        return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    chart = Path(argv[1]).resolve()
    cases: dict[str, dict[str, Any]] = json.load(sys.stdin)["cases"]
    results: dict[str, Any] = {}
    for name, case in cases.items():
        results[name] = {
            "lint": lint(chart, case.get("values") or {}),
            "install": asyncio.run(install(chart, case)),
        }
    json.dump({"helm": helm.get_version(), "cases": results}, sys.stdout, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
