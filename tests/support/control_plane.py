"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, as built by ``scripts/build-control-plane.sh``.

``ControlPlane(bin_dir).start()`` runs them in a private temporary directory with real
certificates (a CA, a serving certificate, a client certificate per identity), service-account
signing keys, ``--authorization-mode=Node,RBAC`` and the API server's default admission plugins.
Each component logs in as the identity the bootstrap RBAC policy expects
(``system:kube-controller-manager``, ``system:kube-scheduler``; kwok as ``kwok-controller``,
bound to the ClusterRole kwok ships). The controller manager runs every default controller with
per-controller service-account credentials. kwok plays the kubelet for nodes annotated
``kwok.x-k8s.io/node=fake``: they go Ready and keep their Lease, and pods bound to them go
Running and Ready and are removed once deleted, by pdx's pod stages
(``scripts/control-plane/kwok-stages.yaml``): a pod annotated ``KWOK_NOT_READY`` stays Running
but not Ready, one annotated ``KWOK_STOP_AT_GRACE`` stays Terminating for its grace period.

``admin_kubeconfig`` is ``system:masters``; ``user_kubeconfig(user, groups)`` mints a client
certificate and ``service_account_kubeconfig(namespace, name)`` a token, for RBAC checks.
``stop()`` ends every process group and removes the directory.

By hand: ``scripts/control-plane.sh up`` (``python -m tests.support.control_plane up``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import functools
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "AUDITED_GROUP",
    "BUILD_SCRIPT",
    "GPU_TAINT",
    "KWOK_ANNOTATION",
    "KWOK_NOT_READY",
    "KWOK_STOP_AT_GRACE",
    "BuildError",
    "ControlPlane",
    "build",
    "cpu_node",
    "p5en_node",
]

ROOT = Path(__file__).parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-control-plane.sh"
LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR: the `kubernetes` Service
# What the API server publishes as the `kubernetes` Service's endpoint. Endpoints may not be
# loopback addresses, and nothing dials the Service here (kwok runs no containers, there is no
# kube-proxy), so an address reserved for documentation (RFC 5737) stands in.
ADVERTISE_ADDRESS = "192.0.2.1"
POD_CIDR = "10.244.0.1/16"  # kwok hands pod IPs out of it
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_SECONDS = float(os.environ.get("PDX_CONTROL_PLANE_START_TIMEOUT", "180"))
CERT_DAYS = 30
# Nodes kwok manages (and only those: a node without it is nobody's).
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# pdx's kwok pod stages, which replace kwok's fast pod-ready and pod-delete: annotations a test
# sets on a pod to hold it out of Ready (a failing readiness probe), or to keep it Terminating
# until its grace period ends (a preStop drain that uses all of it) instead of removing it at once.
KWOK_STAGES = ROOT / "scripts" / "control-plane" / "kwok-stages.yaml"
KWOK_NOT_READY = ("kwok.pdx.dev/ready", "false")
KWOK_STOP_AT_GRACE = ("kwok.pdx.dev/stop", "grace")
KWOK_REPLACED_STAGES = ("pod-ready.yaml", "pod-delete.yaml")  # kwok's fast ones, from share/kwok
# The taint GPU nodes carry; pdx's renderer tolerates key nvidia.com/gpu, Exists, NoSchedule.
GPU_TAINT: dict[str, str] = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# The API server's audit log records the requests of identities in this group, and nobody
# else's (``audited_kubeconfig``, ``audit``): how a test counts what a client sent.
AUDITED_GROUP = "pdx:audited"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],  # one event per request (a watch adds ResponseStarted)
    "rules": [{"level": "Metadata", "userGroups": [AUDITED_GROUP]}, {"level": "None"}],
}
# Components in start order; stop() goes the other way.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

T = TypeVar("T")


class BuildError(RuntimeError):
    """The control plane could not be built on this machine; the message says why."""


def build(script: Path = BUILD_SCRIPT, *, show_progress: bool = False) -> Path:
    """The directory with the six binaries (builds them on a cold cache: tens of minutes).
    ``show_progress`` lets the script's log through to stderr instead of keeping it for the error."""
    stderr = None if show_progress else subprocess.PIPE
    result = subprocess.run([str(script)], stdout=subprocess.PIPE, stderr=stderr, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{script.name} failed (exit {result.returncode}):\n{(result.stderr or '')[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def _ephemeral_ports() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now, below the ephemeral range: the kernel hands
    ephemeral ports to the components' own outgoing connections, which could take a port picked
    there before the component meant to listen on it starts."""
    ephemeral = _ephemeral_ports()
    candidates = [p for p in range(10000, 32768) if p not in ephemeral] or list(range(1024, ephemeral.start))
    ports: list[int] = []
    for port in random.sample(candidates, len(candidates)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports on {LOOPBACK}")


class CommandFailed(subprocess.CalledProcessError):
    """A failed kubectl or helm whose message carries its stderr: pytest prints the exception's
    text, and a bare CalledProcessError's leaves out why (a CI run lost why a CRD wait failed)."""

    def __str__(self) -> str:
        why = (self.stderr or "").strip()[-2000:]
        return f"{super().__str__()} stderr: {why or '(empty)'}"


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0, every: float = 0.2) -> T:
    """Poll ``check`` until it returns something other than None (or False); TimeoutError names ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


# --- certificates -------------------------------------------------------------------------------


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


@dataclass(frozen=True)
class Pki:
    """A CA in ``where`` (ca.crt, ca.key) that issues serving and client certificates."""

    where: Path

    @property
    def ca(self) -> Path:
        return self.where / "ca.crt"

    def create_ca(self, common_name: str = "pdx-control-plane-ca") -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        self.where.mkdir(parents=True, exist_ok=True)
        _write_key(self.where / "ca.key", key)
        self.ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        common_name: str,
        organizations: Iterable[str] = (),
        *,
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """``stem``.crt and ``stem``.key: a serving certificate when ``dns``/``ips`` are given, else a client one."""
        ca_key = serialization.load_pem_private_key((self.where / "ca.key").read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serving = bool(dns or ips)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_encipherment=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    content_commitment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if serving else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if serving:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        crt_path, key_path = self.where / f"{stem}.crt", self.where / f"{stem}.key"
        _write_key(key_path, key)
        crt_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return crt_path, key_path


def _service_account_keys(where: Path) -> tuple[Path, Path]:
    """The key pair service-account tokens are signed with (ES256): private, public."""
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = where / "sa.key", where / "sa.pub"
    _write_key(private, key)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def write_kubeconfig(path: Path, server: str, ca: Path, user: Mapping[str, str], name: str = "pdx") -> Path:
    """A kubeconfig (JSON, which kubectl and client-go read as YAML) with one cluster, user and context."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": dict(user)}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


# --- nodes ---------------------------------------------------------------------------------------


def _node(
    name: str,
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    taints: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    key, value = KWOK_ANNOTATION
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {},
        "status": {"allocatable": dict(allocatable), "capacity": dict(allocatable)},
    }
    if taints:
        node["spec"]["taints"] = [dict(t) for t in taints]
    return node


def p5en_node(name: str, zone: str = "us-east-2a") -> dict[str, Any]:
    """A p5en.48xlarge as EKS shows it: 8 GPUs and 16 EFA devices allocatable, the GPU taint,
    the instance-type label pdx's profiles select on, and 2 MiB hugepages for 8 EFA engines."""
    return _node(
        name,
        labels={
            "node.kubernetes.io/instance-type": "p5en.48xlarge",
            "topology.kubernetes.io/zone": zone,
            "nvidia.com/gpu.present": "true",
        },
        allocatable={
            "cpu": "192",
            "memory": "2Ti",
            "ephemeral-storage": "28Ti",
            "hugepages-2Mi": "42Gi",
            "nvidia.com/gpu": "8",
            "vpc.amazonaws.com/efa": "16",
            "pods": "110",
        },
        taints=[GPU_TAINT],
    )


def cpu_node(name: str, cpus: int = 16, memory: str = "64Gi", zone: str = "us-east-2a") -> dict[str, Any]:
    """A CPU node (m7i-like), untainted: the operator, the router and CPU engines land here."""
    return _node(
        name,
        labels={"node.kubernetes.io/instance-type": "m7i.4xlarge", "topology.kubernetes.io/zone": zone},
        allocatable={"cpu": str(cpus), "memory": memory, "ephemeral-storage": "100Gi", "pods": "110"},
    )


# --- the control plane ----------------------------------------------------------------------------


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL when the Python process dies without its teardown (killed): nothing outlives it.
    Not SIGTERM: all five would get it at once, etcd goes first, and the API server's graceful
    shutdown then hangs without its storage."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on loopback.

    ``workload_controllers=False`` starts etcd and the API server only: no controller makes pods,
    Endpoints, ServiceAccounts or garbage-collects, no scheduler, no kwok (so no node goes Ready).
    What the operator costs the real API server without the controllers' load (the benchmark's
    counterpart of its kmock leg)."""

    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pdx-control-plane-")))
    keep_workdir: bool = False
    workload_controllers: bool = True
    apiserver_profiling: bool = False  # /debug/pprof on the API server (benchmarks' CPU profiles)
    url: str = ""
    started_in: float = 0.0
    ports: dict[str, int] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- paths and identities

    @property
    def pki(self) -> Pki:
        return Pki(self.workdir / "pki")

    @property
    def ca(self) -> Path:
        return self.pki.ca

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def admin_kubeconfig(self) -> Path:
        """``system:masters``: every verb on everything (what `kubectl` users have on a kind cluster)."""
        return self.workdir / "kubeconfig" / "admin.kubeconfig"

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._procs.items()}

    def _cert_kubeconfig(self, stem: str, user: str, groups: Iterable[str] = ()) -> Path:
        crt, key = self.pki.issue(stem, user, groups)
        where = self.workdir / "kubeconfig"
        where.mkdir(exist_ok=True)
        return write_kubeconfig(
            where / f"{stem}.kubeconfig",
            self.url,
            self.ca,
            {"client-certificate": str(crt), "client-key": str(key)},
        )

    def user_kubeconfig(self, user: str, groups: Iterable[str] = ()) -> Path:
        """A kubeconfig with a new client certificate: CN=``user``, O=each of ``groups``."""
        stem = "user-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        return self._cert_kubeconfig(stem, user, groups)

    def audited_kubeconfig(self, user: str) -> Path:
        """``user`` in ``system:masters`` whose requests the audit log records (``audit``)."""
        return self.user_kubeconfig(user, ["system:masters", AUDITED_GROUP])

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    def audit_mark(self) -> int:
        """Where the audit log ends now: ``audit(since=...)`` reads what comes after."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit(self, user: str, since: int = 0) -> list[dict[str, Any]]:
        """The audit events of ``user``'s requests (from ``audited_kubeconfig``) logged after
        ``since``, one per request: its ``verb``, ``requestURI``, ``objectRef`` and code."""
        if not self.audit_log.exists():
            return []
        with self.audit_log.open("rb") as log:
            log.seek(since)
            lines = log.read().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        mine = [e for e in events if e.get("user", {}).get("username") == user]
        # A watch logs ResponseStarted and, once it ends, ResponseComplete: count it once.
        seen: set[str] = set()
        out = []
        for event in mine:
            if event["auditID"] not in seen:
                seen.add(event["auditID"])
                out.append(event)
        return out

    def service_account_kubeconfig(self, namespace: str, name: str, seconds: int = 3600) -> Path:
        """A kubeconfig with a bound token of ServiceAccount ``namespace/name`` (TokenRequest API)."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={seconds}s"
        ).stdout.strip()  # fmt: skip
        where = self.workdir / "kubeconfig"
        return write_kubeconfig(where / f"sa-{namespace}-{name}.kubeconfig", self.url, self.ca, {"token": token})

    # -- kubectl

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """The built kubectl as ``kubeconfig`` (admin by default); a failure raises CommandFailed."""
        argv = [
            str(self.kubectl_path),
            "--kubeconfig", str(kubeconfig or self.admin_kubeconfig),
            "--cache-dir", str(self.workdir / "kubectl-cache"),  # not ~/.kube/cache: one per port, forever
            *args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        if check and result.returncode != 0:
            raise CommandFailed(result.returncode, argv, result.stdout, result.stderr)
        return result

    def get(self, *args: str, kubeconfig: Path | None = None) -> Any:
        """``kubectl get ARGS -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json", kubeconfig=kubeconfig).stdout)

    def apply(self, *objects: Mapping[str, Any], kubeconfig: Path | None = None) -> None:
        """Server-side apply of the objects (as field manager ``pdx-test``)."""
        body = "\n".join(json.dumps(o) for o in objects)
        self.kubectl("apply", "--server-side", "--field-manager=pdx-test", "-f", "-", input=body, kubeconfig=kubeconfig)

    def add_nodes(self, *nodes: Mapping[str, Any], timeout: float = 60.0) -> None:
        """Create kwok nodes (``p5en_node``, ``cpu_node``) and wait until each is Ready and untainted
        by the node lifecycle controller (no ``node.kubernetes.io/not-ready``)."""
        self.kubectl("create", "-f", "-", input="\n".join(json.dumps(n) for n in nodes))
        for node in nodes:
            name: str = node["metadata"]["name"]
            wait_for(f"node {name} Ready and schedulable", functools.partial(self._node_ready, name), timeout)

    def _node_ready(self, name: str) -> bool:
        node = self.get("node", name)
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        taints = {t["key"] for t in node["spec"].get("taints", [])}
        return ready and not any(t.startswith("node.kubernetes.io/") for t in taints)

    # -- processes

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        with (logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env={k: v for k, v in os.environ.items() if not k.startswith("KUBE")},
                start_new_session=True,  # its own process group: stop() signals the group
                preexec_fn=_die_with_parent,
            )
        self._procs[name] = proc
        return proc

    def _alive(self, name: str) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def _get_ok(self, url: str, context: ssl.SSLContext | None = None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=3, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_healthy(self, name: str, url: str, context: ssl.SSLContext | None = None) -> None:
        def check() -> bool:
            self._alive(name)
            return self._get_ok(url, context)

        try:
            wait_for(f"{name} at {url}", check, START_TIMEOUT_SECONDS, every=0.1)
        except TimeoutError as err:
            raise RuntimeError(f"{err}\n{self.log(name)}") from None

    def _admin_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.pki.where / "admin.crt"), str(self.pki.where / "admin.key"))
        return context

    def start(self) -> ControlPlane:
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _start(self) -> None:
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok"):
            if not os.access(self.bin_dir / name, os.X_OK):
                raise FileNotFoundError(f"{self.bin_dir / name}: not built (scripts/build-control-plane.sh)")
        kwok_share = self.bin_dir.parent / "share" / "kwok"
        names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self.url = f"https://{LOOPBACK}:{self.ports['kube-apiserver']}"
        pki = self.pki
        pki.create_ca()
        # The aggregation layer's own CA and client (kubeadm's front-proxy): the API server
        # publishes the CA in kube-system/extension-apiserver-authentication, where delegated
        # authentication (controller manager, scheduler, later extension API servers) reads it.
        front_proxy = Pki(pki.where / "front-proxy")
        front_proxy.create_ca("pdx-front-proxy-ca")
        front_proxy.issue("front-proxy-client", "front-proxy-client")
        pki.issue(
            "apiserver",
            "kube-apiserver",
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"],
            ips=[LOOPBACK, API_SERVICE_IP],
        )  # fmt: skip
        # The API server's client certificate for kubelets (logs, exec): none here, but set as kubeadm does.
        pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["kubeadm:cluster-admins"])
        sa_key, sa_pub = _service_account_keys(pki.where)
        (self.workdir / "kubeconfig").mkdir()
        self._cert_kubeconfig("admin", "pdx-admin", ["system:masters"])
        audit_policy = self.workdir / "audit-policy.json"
        audit_policy.write_text(json.dumps(AUDIT_POLICY))
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        kcm = self._cert_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        scheduler = self._cert_kubeconfig("kube-scheduler", "system:kube-scheduler")
        kwok = self._cert_kubeconfig("kwok", "kwok-controller")

        # etcd: plain HTTP on loopback, no fsync (a test's data need not survive a crash).
        etcd_url = f"http://{LOOPBACK}:{self.ports['etcd']}"
        peer_url = f"http://{LOOPBACK}:{self.ports['etcd-peer']}"
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name", "pdx", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"pdx={peer_url}", "--unsafe-no-fsync", "--log-level", "warn",
        ])  # fmt: skip
        self._wait_healthy("etcd", f"{etcd_url}/health")

        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            "--etcd-servers", etcd_url,
            "--bind-address", LOOPBACK, "--advertise-address", ADVERTISE_ADDRESS,
            "--secure-port", str(self.ports["kube-apiserver"]),
            "--cert-dir", str(self.workdir / "apiserver-certs"),
            "--tls-cert-file", str(pki.where / "apiserver.crt"),
            "--tls-private-key-file", str(pki.where / "apiserver.key"),
            "--client-ca-file", str(self.ca),
            "--requestheader-client-ca-file", str(front_proxy.ca),
            "--requestheader-allowed-names", "front-proxy-client",
            "--requestheader-username-headers", "X-Remote-User",
            "--requestheader-group-headers", "X-Remote-Group",
            "--requestheader-extra-headers-prefix", "X-Remote-Extra-",
            "--proxy-client-cert-file", str(front_proxy.where / "front-proxy-client.crt"),
            "--proxy-client-key-file", str(front_proxy.where / "front-proxy-client.key"),
            "--kubelet-client-certificate", str(pki.where / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key", str(pki.where / "apiserver-kubelet-client.key"),
            "--service-account-issuer", SA_ISSUER,
            "--service-account-key-file", str(sa_pub),
            "--service-account-signing-key-file", str(sa_key),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC",
            "--audit-policy-file", str(audit_policy),
            "--audit-log-path", str(self.audit_log),
            "--audit-log-format", "json",
            "--audit-log-mode", "blocking",
            "--allow-privileged=true",
            f"--profiling={str(self.apiserver_profiling).lower()}",
        ])  # fmt: skip
        self._wait_healthy("kube-apiserver", f"{self.url}/readyz", self._admin_context())
        if not self.workload_controllers:
            return

        insecure = ssl.create_default_context()  # the components' self-signed serving certificates
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            "--kubeconfig", str(kcm),
            "--authentication-kubeconfig", str(kcm), "--authorization-kubeconfig", str(kcm),
            "--bind-address", LOOPBACK, "--secure-port", str(self.ports["kube-controller-manager"]),
            "--cert-dir", str(self.workdir / "kcm-certs"),
            "--client-ca-file", str(self.ca),
            "--root-ca-file", str(self.ca),
            "--service-account-private-key-file", str(sa_key),
            "--use-service-account-credentials=true",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--controllers=*",
            "--profiling=false",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            "--kubeconfig", str(scheduler),
            "--authentication-kubeconfig", str(scheduler), "--authorization-kubeconfig", str(scheduler),
            "--bind-address", LOOPBACK, "--secure-port", str(self.ports["kube-scheduler"]),
            "--cert-dir", str(self.workdir / "scheduler-certs"),
            "--client-ca-file", str(self.ca),
            "--profiling=false",
        ])  # fmt: skip

        # kwok: its own ClusterRole (as kwok ships it) bound to its identity, and its stages.
        self.kubectl("apply", "-f", str(kwok_share / "rbac.yaml"))
        self.apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kwok-controller"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kwok-controller"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kwok-controller"}],
        })  # fmt: skip
        kwok_config = self.workdir / "kwok.yaml"
        stages = [
            p.read_text() for p in sorted((kwok_share / "stages").glob("*.yaml")) if p.name not in KWOK_REPLACED_STAGES
        ]
        stages.append(KWOK_STAGES.read_text())
        kwok_config.write_text(
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n"
            # kwok's defaults, which it does not apply to a configuration file's options
            "  nodeLeaseDurationSeconds: 40\n  nodeLeaseParallelism: 4\n  nodePlayStageParallelism: 4\n"
            "  podPlayStageParallelism: 4\n  podsOnNodeSyncParallelism: 1\n---\n" + "\n---\n".join(stages)
        )
        key, value = KWOK_ANNOTATION
        self._spawn("kwok", [
            str(self.bin_dir / "kwok"),
            "--config", str(kwok_config),
            "--kubeconfig", str(kwok),
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--cidr", POD_CIDR,
            "--node-ip", LOOPBACK,
            "--server-address", f"{LOOPBACK}:{self.ports['kwok']}",
        ])  # fmt: skip

        self._wait_healthy(
            "kube-controller-manager", f"https://{LOOPBACK}:{self.ports['kube-controller-manager']}/healthz", insecure
        )
        self._wait_healthy("kube-scheduler", f"https://{LOOPBACK}:{self.ports['kube-scheduler']}/healthz", insecure)
        self._wait_healthy("kwok", f"http://{LOOPBACK}:{self.ports['kwok']}/healthz")

        # Leaders elected, and the controllers acting: the ServiceAccount controller has made
        # `default` in `default`, and the root CA publisher its ConfigMap.
        def settled() -> bool:
            for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                self._alive(name)
            leases = self.kubectl("get", "lease", "-n", "kube-system", "-o", "json", check=False)
            if leases.returncode != 0:
                return False
            held = {
                item["metadata"]["name"] for item in json.loads(leases.stdout)["items"]
                if item["spec"].get("holderIdentity")
            }  # fmt: skip
            if not {"kube-controller-manager", "kube-scheduler"} <= held:
                return False
            sa = self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
            cm = self.kubectl("get", "configmap", "kube-root-ca.crt", "-n", "default", check=False)
            return sa.returncode == 0 and cm.returncode == 0

        try:
            wait_for("leader election and the default ServiceAccount", settled, START_TIMEOUT_SECONDS, every=0.5)
        except TimeoutError as err:
            raise RuntimeError(f"{err}\n{self.log('kube-controller-manager')}\n{self.log('kube-scheduler')}") from None

    def stop(self) -> None:
        """kwok, scheduler, controller manager, API server, etcd: SIGTERM to each process group,
        SIGKILL after 10 s; then the directory goes (unless ``keep_workdir``)."""
        for name in reversed(COMPONENTS):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(ProcessLookupError):  # anything it left in its group
                os.killpg(proc.pid, signal.SIGKILL)
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(bin_dir: Path | None = None, **kwargs: Any) -> Iterator[ControlPlane]:
    """Build (if needed) and run a control plane for the ``with`` block."""
    with ControlPlane(bin_dir or build(), **kwargs) as cp:
        yield cp


# --- by hand -----------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    print("building the control plane (scripts/build-control-plane.sh; cached after the first time)", file=sys.stderr)
    bin_dir = build(show_progress=True)
    workdir = Path(tempfile.mkdtemp(prefix="pdx-control-plane-"))
    cp = ControlPlane(bin_dir, workdir=workdir, keep_workdir=args.keep)
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with cp:
        nodes = [p5en_node(f"p5en-{i}") for i in range(args.gpu_nodes)]
        nodes += [cpu_node(f"cpu-{i}") for i in range(args.cpu_nodes)]
        if nodes:
            cp.add_nodes(*nodes)
        print(
            f"control plane up in {cp.started_in:.1f} s: API server {cp.url} (Kubernetes 1.36, RBAC on), "
            f"{args.gpu_nodes} p5en.48xlarge + {args.cpu_nodes} CPU kwok nodes\n"
            f"logs: {workdir / 'logs'}\n"
            f"in another shell:\n"
            f"  export KUBECONFIG={cp.admin_kubeconfig}\n"
            f"  export PATH={bin_dir}:$PATH   # this kubectl\n"
            "Ctrl-C stops it and removes the directory" + (" (kept: --keep)" if args.keep else ""),
            flush=True,
        )
        while not stopping:
            for name in COMPONENTS:
                cp._alive(name)
            time.sleep(0.5)
        print("stopping", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.control_plane", description=(__doc__ or "").split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build if needed, start, create kwok nodes, wait for Ctrl-C")
    up.add_argument("--gpu-nodes", type=int, default=2, help="p5en.48xlarge kwok nodes (default 2)")
    up.add_argument("--cpu-nodes", type=int, default=1, help="CPU kwok nodes (default 1)")
    up.add_argument("--keep", action="store_true", help="keep the directory (logs, etcd data) after Ctrl-C")
    sub.add_parser("build", help="build if needed and print the bin directory")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build())
        return 0
    return _up(args)


if __name__ == "__main__":
    sys.exit(main())
