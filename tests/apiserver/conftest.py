"""One real CRD API server per test session, with pdx's CRD installed.

The server is built by scripts/build-crd-apiserver.sh (minutes on a cold cache, instant after).
A machine that cannot build it fails these tests; PDX_SKIP_APISERVER=1 skips them instead,
with the reason in pytest's summary.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s_client

from pdx.controller.kube import Kube
from tests.apiserver.client import CRD_FILES, Api, established, load_yaml
from tests.apiserver.server import BuildError, CrdApiServer, build


@pytest.fixture(scope="session")
def apiserver() -> Iterator[CrdApiServer]:
    if os.environ.get("PDX_SKIP_APISERVER") == "1":
        pytest.skip("PDX_SKIP_APISERVER=1: the tests against a real CRD API server are skipped")
    try:
        bin_dir = build()
    except BuildError as err:
        pytest.fail(f"no CRD API server on this machine (PDX_SKIP_APISERVER=1 skips these tests): {err}")
    with CrdApiServer(bin_dir) as server:
        yield server


@pytest.fixture(scope="session")
def api(apiserver: CrdApiServer) -> Api:
    """The server with every CRD of crds/ and of the chart applied and Established."""
    client = Api(apiserver)
    for path in CRD_FILES:
        for doc in load_yaml(path.read_text()):
            code, body = client.apply(doc, manager=f"pdx-test-{path.parent.name}")
            assert code in (200, 201), (path, body)
            established(client, doc["metadata"]["name"])
    return client


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of its own per test (the server needs no Namespace object: admission is off)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    return f"{slug}-{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]}"



@pytest.fixture(scope="session")
def kube(api: Api) -> Kube:
    """The operator's own API layer, logged in with the client certificate."""
    config = k8s_client.Configuration(host=api.server.url)
    config.ssl_ca_cert = str(api.server.ca)
    config.cert_file, config.key_file = api.server.client_cert
    return Kube(k8s_client.ApiClient(config))
