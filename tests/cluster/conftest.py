"""The operator against the session's real control plane (``control_plane``, ``namespace``,
``pdx_crd`` and ``cluster`` come from tests/conftest.py, shared with tests/images): its identity
with every request audited, its client, and the whole kopf operator in this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pdx.controller.kube import Kube
from tests.support.control_plane import ControlPlane
from tests.support.operator_cluster import OPERATOR_USER, Cluster, InProcessOperator, kube_for


@pytest.fixture(scope="session")
def operator_kubeconfig_audited(control_plane: ControlPlane) -> Path:
    """The operator's identity in these tests: every verb (as a cluster's admin) and every
    request in the audit log (``control_plane.audit(OPERATOR_USER)``)."""
    return control_plane.audited_kubeconfig(OPERATOR_USER)


@pytest.fixture
def operator_kube(operator_kubeconfig_audited: Path) -> Kube:
    return kube_for(operator_kubeconfig_audited)


@pytest.fixture
def in_process_operator(
    operator_kubeconfig_audited: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InProcessOperator]:
    op = InProcessOperator(operator_kubeconfig_audited, cluster.ns, monkeypatch)
    yield op
    op.stop()
