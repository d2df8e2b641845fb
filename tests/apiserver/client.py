"""How kubectl talks to the API server, as plain HTTP: apply, get, put, Table output.

`load_yaml` reads manifests as kubectl does: a duplicate mapping key is an error, not a
silent "last one wins" (PyYAML's default).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pdx.resource import manifest_documents
from pdx.spec import API_VERSION, PLURAL
from tests.apiserver.server import ROOT, CrdApiServer

CRD_FILES = [*sorted((ROOT / "crds").glob("*.yaml")), *sorted((ROOT / "charts/pdx-operator/crds").glob("*.yaml"))]
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
STRICT = {"fieldValidation": "Strict"}


class Api:
    """Raw HTTP against the server, as kubectl sends it; answers are (status, JSON body)."""

    def __init__(self, server: CrdApiServer) -> None:
        self.server = server
        self.http = server.session()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, Any]:
        resp = self.http.request(
            method,
            self.server.url + path,
            params=params,
            data=None if body is None else (body if isinstance(body, str) else json.dumps(body)),
            headers={"Content-Type": content_type, "Accept": accept},
            timeout=30,
        )
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text

    def apply(self, obj: dict[str, Any], manager: str = "kubectl", *, force: bool = False) -> tuple[int, Any]:
        """`kubectl apply --server-side` (kubectl validates strictly by default)."""
        params = {**STRICT, "fieldManager": manager}
        if force:
            params["force"] = "true"
        return self.request("PATCH", object_path(obj), obj, params=params, content_type="application/apply-patch+yaml")

    def get(self, path: str) -> dict[str, Any]:
        code, body = self.request("GET", path)
        assert code == 200, body
        assert isinstance(body, dict)
        return body


def object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    if obj["kind"] == "CustomResourceDefinition":
        return f"{CRD_PATH}/{meta['name']}"
    return cr_path(meta.get("namespace") or "default", meta["name"])


def cr_path(namespace: str, name: str | None = None) -> str:
    out = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{out}/{name}" if name else out


def established(api: Api, name: str, timeout: float = 20.0) -> dict[str, Any]:
    """The CRD once Established (its API is served), or AssertionError with its conditions."""
    deadline = time.monotonic() + timeout
    while True:
        crd = api.get(f"{CRD_PATH}/{name}")
        conds = {c["type"]: c for c in (crd.get("status") or {}).get("conditions") or []}
        if conds.get("Established", {}).get("status") == "True":
            return crd
        assert time.monotonic() < deadline, conds
        time.sleep(0.1)



def load_yaml(text: str) -> list[dict[str, Any]]:
    """Every document of a manifest file, read as kubectl reads it (pdx render reads so too)."""
    return manifest_documents(text)
