"""A real Kubernetes API server for CRDs (k8s.io/apiextensions-apiserver) with etcd, on loopback.

`scripts/build-crd-apiserver.sh` builds the server (cached); `CrdApiServer` starts etcd and the
server in a private temporary directory with client-certificate auth (a client of group
`system:masters`), and `stop()` ends both and removes the directory.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from pdx.local.plan import LOOPBACK
from pdx.local.topology import free_port

ROOT = Path(__file__).parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-crd-apiserver.sh"
START_TIMEOUT_SECONDS = float(os.environ.get("PDX_APISERVER_START_TIMEOUT", "60"))
# Admission plugins the CRD server enables by default; all off, as the server has no core API
# (namespaces, webhooks) for them to consult.
ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "MutatingAdmissionPolicy",
)


class BuildError(RuntimeError):
    """The server could not be built on this machine; the message says why."""


def build() -> Path:
    """The directory with `apiextensions-apiserver` and `etcd` (builds them on a cold cache)."""
    result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{BUILD_SCRIPT.name} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


# P-256 keys: a tenth of RSA-2048's generation time, which was most of the server's start-up.
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(where: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1 and a client certificate in system:masters."""
    _openssl("req", "-x509", *EC_KEY, "-days", "1", "-subj", "/CN=pdx-test-ca",
             "-keyout", str(where / "ca.key"), "-out", str(where / "ca.crt"))  # fmt: skip
    for name, subject, ext in (
        ("serving", "/CN=127.0.0.1", f"subjectAltName=IP:{LOOPBACK},DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "/O=system:masters/CN=pdx-test", "extendedKeyUsage=clientAuth"),
    ):
        (where / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", *EC_KEY, "-subj", subject,
                 "-keyout", str(where / f"{name}.key"), "-out", str(where / f"{name}.csr"))  # fmt: skip
        _openssl("x509", "-req", "-in", str(where / f"{name}.csr"), "-CA", str(where / "ca.crt"),
                 "-CAkey", str(where / "ca.key"), "-CAcreateserial", "-days", "1",
                 "-extfile", str(where / f"{name}.ext"), "-out", str(where / f"{name}.crt"))  # fmt: skip


def _dummy_kubeconfig(path: Path, port: int) -> None:
    """The server's clients of a core API (informers, token and access reviews) must be
    configured; nothing answers there. Client certificates of system:masters need neither."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: none, cluster: {{server: 'http://{LOOPBACK}:{port}'}}}}]\n"
        "users: [{name: none, user: {}}]\n"
        "contexts: [{name: none, context: {cluster: none, user: none}}]\n"
        "current-context: none\n"
    )


def _die_with_parent() -> None:
    """SIGTERM when pytest dies without its teardown (killed): nothing outlives the run."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


@dataclass
class CrdApiServer:
    """etcd plus apiextensions-apiserver; `url`, `session` and the cert paths once started."""

    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pdx-apiserver-")))
    url: str = ""
    started_in: float = 0.0
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def ca(self) -> Path:
        return self.workdir / "ca.crt"

    @property
    def client_cert(self) -> tuple[str, str]:
        return str(self.workdir / "client.crt"), str(self.workdir / "client.key")

    def session(self) -> requests.Session:
        s = requests.Session()
        s.trust_env = False  # else REQUESTS_CA_BUNDLE (set on CI machines) replaces our CA
        s.cert = self.client_cert
        s.verify = str(self.ca)
        return s

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
        )
        log.close()
        self._procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _wait(self, name: str, proc: subprocess.Popen[bytes], url: str, session: requests.Session) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            try:
                if session.get(url, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{name} not ready within {START_TIMEOUT_SECONDS} s:\n{self.log(name)}")

    def start(self) -> CrdApiServer:
        began = time.monotonic()
        try:
            make_certs(self.workdir)
            etcd_port, peer_port, port, nobody = (free_port() for _ in range(4))
            etcd_url = f"http://{LOOPBACK}:{etcd_port}"
            etcd = self._spawn("etcd", [
                str(self.bin_dir / "etcd"), "--name", "pdx-test", "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", f"http://{LOOPBACK}:{peer_port}",
                "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{peer_port}",
                "--initial-cluster", f"pdx-test=http://{LOOPBACK}:{peer_port}",
                "--unsafe-no-fsync", "--log-level", "warn",
            ])  # fmt: skip
            self._wait("etcd", etcd, f"{etcd_url}/health", self.session())
            _dummy_kubeconfig(self.workdir / "core.kubeconfig", nobody)
            server = self._spawn("apiserver", [
                str(self.bin_dir / "apiextensions-apiserver"),
                "--etcd-servers", etcd_url,
                "--bind-address", LOOPBACK, "--secure-port", str(port),
                "--tls-cert-file", str(self.workdir / "serving.crt"),
                "--tls-private-key-file", str(self.workdir / "serving.key"),
                "--client-ca-file", str(self.ca),
                "--authentication-skip-lookup",
                "--kubeconfig", str(self.workdir / "core.kubeconfig"),
                "--authentication-kubeconfig", str(self.workdir / "core.kubeconfig"),
                "--authorization-kubeconfig", str(self.workdir / "core.kubeconfig"),
                "--disable-admission-plugins", ",".join(ADMISSION_PLUGINS),
                "--enable-priority-and-fairness=false",  # its config lives in the absent core API
            ])  # fmt: skip
            self.url = f"https://{LOOPBACK}:{port}"
            # informer-sync waits for the core API's informers, which never sync (there is none).
            self._wait("apiserver", server, f"{self.url}/readyz?exclude=informer-sync", self.session())
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Server first, then etcd; SIGKILL after 10 s; then the directory goes."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self._procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> CrdApiServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

