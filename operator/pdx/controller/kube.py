"""All Kubernetes API I/O of the operator: get, list, server-side apply, status, delete.

Built on the official client's configuration (address, auth, TLS; kubeconfig or in-cluster)
but speaking plain JSON dicts over one keep-alive HTTP/1.1 connection per thread
(`http1.Connection`): rendered manifests go out as they are (orjson), and any object can be
compared with what was rendered. The generated client's request path (parameter sanitising,
serialisation, per-request auth refresh), then urllib3's pool and response layers, then
`http.client`'s header handling, each cost more CPU than the rest of an apply; a pass sends a
dozen requests in a row on one thread, which needs no pool. Through an HTTP proxy (kubeconfig
`proxy-url`) calls go through the client's urllib3 pool instead. One field manager,
`pdx-operator`, owns every child.
"""

from __future__ import annotations

import datetime
import http.client
import json
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from pdx import labels
from pdx.controller.http1 import Connection, Stale
from pdx.kinds import PLURALS
from pdx.spec import API_VERSION, KIND

AUTH_REFRESH_SECONDS = 60.0
APPLY = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON
MERGE = "application/merge-patch+json"
# The API server's default for writes is `Warn`: it decodes every patch a second time, strictly,
# only to put unknown or duplicate fields into Warning headers (an apply's YAML is parsed twice).
# Nobody reads those headers here, and `Warn` drops such fields as `Ignore` does; the second
# parse was API server CPU for every one of a new resource's 14 writes.
IGNORE_UNKNOWN = ("fieldValidation", "Ignore")


class ApiError(Exception):
    """A non-2xx answer; `status` lets callers tell not-found and conflicts from failures.

    Status 0 is a transport failure (timeout, refused, reset): handlers retry those as soon as
    API errors instead of leaving them to kopf's default backoff for unexpected errors (60 s).
    """

    def __init__(self, status: int, method: str, path: str, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    plural = PLURALS[(api_version, kind)]
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    out = f"{root}/namespaces/{namespace}/{plural}"
    if name:
        out += f"/{name}"
    if sub:
        out += f"/{sub}"
    return out


def _matches(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


def make_api_client() -> k8s_client.ApiClient:
    """In-cluster service account first, then kubeconfig (same order as kopf's own login)."""
    try:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
    return k8s_client.ApiClient(k8s_client.Configuration.get_default_copy())


def ssl_context(config: k8s_client.Configuration) -> ssl.SSLContext:
    """TLS as the client's configuration says: CA, client certificate, verification."""
    ctx = ssl.create_default_context(cafile=config.ssl_ca_cert)
    if not config.verify_ssl or config.assert_hostname is False:
        ctx.check_hostname = False
    if not config.verify_ssl:
        ctx.verify_mode = ssl.CERT_NONE
    if config.cert_file:
        ctx.load_cert_chain(config.cert_file, config.key_file)
    return ctx


# A keep-alive connection the server closed while idle fails on its next request before the
# server reads it (`Stale`); that request is sent once more on a new connection (all of ours
# are idempotent: server-side apply, merge patches, GET, DELETE).


@dataclass
class Kube:
    """Synchronous API access; kopf runs sync handlers in its thread pool."""

    api: k8s_client.ApiClient
    field_manager: str = labels.MANAGER
    timeout: float = 15.0
    _auth: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _auth_at: float = field(default=-AUTH_REFRESH_SECONDS, init=False, repr=False)
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False)
    _ssl: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    def _connection(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            where = urlsplit(self.api.configuration.host)
            tls = where.scheme == "https"
            if tls and self._ssl is None:
                self._ssl = ssl_context(self.api.configuration)
            conn = Connection(
                where.hostname or "", where.port or (443 if tls else 80), self.timeout, self._ssl if tls else None
            )
            self._local.conn = conn
        return conn

    def _send(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of one request on this thread's connection."""
        if self.api.configuration.proxy:
            url = f"{self.api.configuration.host}{target}"
            proxied = self.api.rest_client.pool_manager.request(
                method, url, body=body, headers=headers, timeout=urllib3.Timeout(total=self.timeout)
            )
            return proxied.status, proxied.data or b""
        target = urlsplit(self.api.configuration.host).path.rstrip("/") + target
        conn = self._connection()
        try:
            return conn.request(method, target, body, headers)
        except Stale:
            return conn.request(method, target, body, headers)  # on a new connection; fails as it fails

    def _auth_setting(self) -> dict[str, Any] | None:
        """The bearer token setting, re-read once a minute: the client's own per-request
        refresh (kubeconfig or the in-cluster token file) cost ~2 ms of CPU per request,
        a third of an apply. Service-account tokens live an hour; the client refreshes them
        a minute before expiry, so a minute's staleness never sends an expired one."""
        now = time.monotonic()
        if now - self._auth_at >= AUTH_REFRESH_SECONDS:
            setting = self.api.configuration.auth_settings().get("BearerToken")
            self._auth = dict(setting) if setting else None
            self._auth_at = now
        return self._auth

    def call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if content_type or body is not None:
            headers["Content-Type"] = content_type or "application/json"
        if (auth := self._auth_setting()) and auth.get("value"):
            headers[str(auth.get("key") or "authorization")] = str(auth["value"])
        target = path + (f"?{urlencode(query)}" if query else "")
        try:
            status, raw = self._send(method, target, orjson.dumps(body) if body is not None else None, headers)
        except (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError) as err:
            raise ApiError(0, method, path, f"transport: {err}") from err
        if not 200 <= status < 300:
            try:
                message = json.loads(raw).get("message") or raw[:300].decode(errors="replace")
            except (ValueError, AttributeError):
                message = raw[:300].decode(errors="replace")
            raise ApiError(status, method, path, message)
        # orjson: list answers are the bulk of what a pass decodes (several times faster).
        return orjson.loads(raw) if raw else None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.call("GET", path_of(api_version, kind, namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return obj

    def list(self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Objects carrying all `labels`; filtered here too, in case the server ignores selectors."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        try:
            answer = self.call(
                "GET", path_of(api_version, kind, namespace), query=[("labelSelector", selector)] if selector else []
            )
        except ApiError as err:
            if err.status == 404:  # an API the server does not serve: nothing of ours there
                return []
            raise
        items: list[dict[str, Any]] = (answer or {}).get("items") or []
        for item in items:  # list items omit apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return [i for i in items if _matches(i, labels)]

    def apply(self, obj: Mapping[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        """Server-side apply; force takes fields back from whoever hand-edited them (drift)."""
        meta = obj["metadata"]
        path = path_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", field_manager or self.field_manager), ("force", "true"), IGNORE_UNKNOWN]
        out: dict[str, Any] = self.call("PATCH", path, query=query, body=dict(obj), content_type=APPLY)
        return out

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        try:
            self.call("DELETE", path_of(api_version, kind, namespace, name), body={"propagationPolicy": "Background"})
        except ApiError as err:
            if err.status != 404:
                raise

    def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, source: EventSource
    ) -> None:
        body = event_body(involved, type_, reason, message, source)
        self.call("POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body=body)

    def get_resource(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(API_VERSION, KIND, namespace, name)

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
        """JSON merge patch of the status subresource: only the keys given change; the CR
        as the server answered (the watch-fed state holds it until the echo arrives)."""
        answer: dict[str, Any] | None = self.call(
            "PATCH",
            path_of(API_VERSION, KIND, namespace, name, "status"),
            query=[IGNORE_UNKNOWN],
            body={"status": dict(status)},
            content_type=MERGE,
        )
        return answer


@dataclass(frozen=True)
class EventSource:
    """Who posts the operator's Events: kopf's posting settings (the handlers copy them at
    startup), so the Events are those kopf's poster wrote."""

    component: str = "kopf"
    instance: str = "dev"
    name_prefix: str = "kopf-event-"


def event_body(
    involved: Mapping[str, Any], type_: str, reason: str, message: str, source: EventSource
) -> dict[str, Any]:
    """A core/v1 Event about `involved`, field for field as kopf's poster builds it."""
    meta = involved.get("metadata") or {}
    ref = {
        k: v
        for k, v in (
            ("apiVersion", involved.get("apiVersion")),
            ("kind", involved.get("kind")),
            ("name", meta.get("name")),
            ("uid", meta.get("uid")),
            ("namespace", meta.get("namespace")),
        )
        if v
    }
    namespace = ref.get("namespace") or "default"
    ref["namespace"] = namespace
    now = datetime.datetime.now(datetime.UTC).isoformat()
    return {
        "metadata": {"namespace": namespace, "generateName": source.name_prefix},
        "action": "Action?",
        "type": type_,
        "reason": reason,
        "message": message,
        "reportingComponent": source.component,
        "reportingInstance": source.instance,
        "source": {"component": source.component},
        "involvedObject": ref,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "eventTime": now,
    }
