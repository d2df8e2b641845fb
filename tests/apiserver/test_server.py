"""The test server itself: client-certificate auth only, and nothing left behind once stopped."""

from __future__ import annotations

import os

import pytest

from tests.apiserver.client import Api
from tests.apiserver.server import CrdApiServer

pytestmark = pytest.mark.apiserver


def test_a_client_without_the_certificate_is_refused(api: Api) -> None:
    """Without it the request is anonymous, and the delegated authorizer has no one to ask."""
    anonymous = api.server.session()
    anonymous.cert = None
    resp = anonymous.get(api.server.url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    assert resp.status_code != 200 and "items" not in resp.text, resp.text
    assert api.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")[0] == 200


def test_stopping_ends_etcd_and_the_server_and_removes_their_directory(api: Api) -> None:
    other = CrdApiServer(api.server.bin_dir).start()
    pids = other.pids
    assert len(pids) == 2 and other.workdir.is_dir()
    other.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not other.workdir.exists()
