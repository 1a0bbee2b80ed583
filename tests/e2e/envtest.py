"""A real Kubernetes control plane on loopback, from the binaries in ``$KUBEBUILDER_ASSETS``.

The controller-runtime ``envtest`` convention: a directory holding ``etcd``, ``kube-apiserver``,
``kube-controller-manager`` and ``kubectl`` (``../shared/envtest/install.sh`` prints one;
``setup-envtest use 1.28 -p path`` gives the same layout anywhere). Unlike envtest, the
controller-manager runs too: without it no namespace is ever deleted to completion, no
``default`` ServiceAccount exists (the ServiceAccount admission plugin then refuses every Pod)
and nothing garbage-collects.

Everything is fresh per start: free ports, a temporary data directory, certificates made with
``cryptography``. :meth:`ControlPlane.stop` kills every process and removes the directory; it is
safe to call twice and after a failed start.

The admission policies are on by default, with the flags the binaries' version needs
(:func:`admission_policy_flags`; ``kube-apiserver --version`` says which, :attr:`ControlPlane.version`):
ValidatingAdmissionPolicy everywhere (``v1beta1`` behind its gate on 1.28, ``v1`` on 1.30+) and
MutatingAdmissionPolicy from 1.32 (``v1alpha1`` behind its gate).
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import ipaddress
import os
import pathlib
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ports import free_ports

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
START_TIMEOUT = 120.0
PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane could not start; the message names the process and its log tail."""


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when the test process dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def missing_binaries(assets: pathlib.Path) -> list[str]:
    return [name for name in BINARIES if not os.access(assets / name, os.X_OK)]


# --- versions and the flags that turn the admission policies on ---------------------------------------------

_VERSION = re.compile(r"\bv(\d+)\.(\d+)\.\d+\S*")
_VERSIONS: dict[tuple[str, int], str] = {}   # (binary, its mtime) -> "v1.28.7": asked once per process


def binary_version(assets: pathlib.Path) -> str:
    """``kube-apiserver --version`` of these assets, e.g. ``v1.32.0-beta.0`` (cached)."""
    binary = assets / "kube-apiserver"
    try:
        key = (str(binary.resolve()), binary.stat().st_mtime_ns)
    except OSError as exc:
        raise ControlPlaneError(f"cannot read {binary}: {exc}") from None
    if key not in _VERSIONS:
        try:
            result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30,
                                    check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ControlPlaneError(f"{binary} --version failed: {exc}") from None
        found = _VERSION.search(result.stdout)
        if result.returncode != 0 or found is None:
            raise ControlPlaneError(f"{binary} --version exited {result.returncode} without a version: "
                                    f"{(result.stdout + result.stderr).strip()[:300]!r}")
        _VERSIONS[key] = found.group(0)
    return _VERSIONS[key]


def minor_version(git_version: str) -> tuple[int, int]:
    """``v1.32.0-beta.0`` -> ``(1, 32)``."""
    found = _VERSION.search(git_version)
    if found is None:
        raise ValueError(f"not a Kubernetes version: {git_version!r}")
    return int(found.group(1)), int(found.group(2))


@dataclasses.dataclass(frozen=True)
class AdmissionPolicyFlags:
    """The flags that turn the admission policies on: kube-apiserver's, kube-controller-manager's."""
    apiserver: tuple[str, ...] = ()
    controller_manager: tuple[str, ...] = ()


NO_FLAGS = AdmissionPolicyFlags()


def admission_policy_flags(version: tuple[int, int]) -> AdmissionPolicyFlags:
    """What a control plane of ``version`` needs to serve and run every admission policy it has.

    1.26-1.29: ValidatingAdmissionPolicy behind its gate (``v1alpha1``, ``v1beta1`` from 1.28), off
    by default; kube-controller-manager needs the gate too, or its type-checking controller
    (``status.typeChecking``) does not run. 1.30-1.31: ``v1``, on; no flag is needed. From 1.32:
    MutatingAdmissionPolicy ``v1alpha1`` behind its gate (ValidatingAdmissionPolicy's gate is gone:
    naming it fails the start); kube-controller-manager accepts the gate but has no controller of
    it, it gets the gate all the same, so both components agree. Tested with 1.28 and 1.32; a newer
    version gets 1.32's flags (override them with ``ControlPlane(admission_policies=...)`` if its
    binaries refuse them).
    """
    if version < (1, 26):
        return NO_FLAGS
    if version < (1, 30):
        api = "v1alpha1" if version < (1, 28) else "v1beta1"
        gate = "--feature-gates=ValidatingAdmissionPolicy=true"
        return AdmissionPolicyFlags((gate, f"--runtime-config=admissionregistration.k8s.io/{api}=true"), (gate,))
    if version < (1, 32):
        return NO_FLAGS
    gate = "--feature-gates=MutatingAdmissionPolicy=true"
    return AdmissionPolicyFlags((gate, "--runtime-config=admissionregistration.k8s.io/v1alpha1=true"), (gate,))


def validating_admission_policy_api(version: tuple[int, int]) -> str:
    """The group version ValidatingAdmissionPolicies are served at with :func:`admission_policy_flags`."""
    if version < (1, 26):
        raise ValueError(f"Kubernetes {version[0]}.{version[1]} has no ValidatingAdmissionPolicy")
    return "admissionregistration.k8s.io/" + ("v1alpha1" if version < (1, 28) else
                                              "v1beta1" if version < (1, 30) else "v1")


# --- certificates ------------------------------------------------------------------------------------------

def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _certificate(subject: x509.Name, key: rsa.RSAPrivateKey, issuer: x509.Name, signer: rsa.RSAPrivateKey, *,
                 ca: bool = False, usage: Sequence[x509.ObjectIdentifier] = (),
                 names: Sequence[str] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
    if names:
        alt: list[x509.GeneralName] = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    return builder.sign(signer, hashes.SHA256())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


@dataclasses.dataclass(frozen=True)
class _Pki:
    ca_crt: pathlib.Path
    ca_key: pathlib.Path
    serving_crt: pathlib.Path
    serving_key: pathlib.Path
    admin_crt: pathlib.Path
    admin_key: pathlib.Path
    sa_key: pathlib.Path
    sa_pub: pathlib.Path

    @classmethod
    def create(cls, directory: pathlib.Path) -> _Pki:
        directory.mkdir(mode=0o700)
        ca_key, serving_key, admin_key, sa_key = _key(), _key(), _key(), _key()
        ca_name = _name("envtest-ca")
        ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True)
        serving = _certificate(_name("kube-apiserver"), serving_key, ca_name, ca_key,
                               usage=[ExtendedKeyUsageOID.SERVER_AUTH],
                               names=["127.0.0.1", "localhost", "10.96.0.1", "kubernetes",
                                      "kubernetes.default", "kubernetes.default.svc"])
        admin = _certificate(_name("envtest-admin", "system:masters"), admin_key, ca_name, ca_key,
                             usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
        pki = cls(*(directory / f for f in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key",
                                            "admin.crt", "admin.key", "sa.key", "sa.pub")))
        pki.ca_crt.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        pki.ca_key.write_bytes(_pem_key(ca_key))
        pki.serving_crt.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
        pki.serving_key.write_bytes(_pem_key(serving_key))
        pki.admin_crt.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
        pki.admin_key.write_bytes(_pem_key(admin_key))
        pki.sa_key.write_bytes(_pem_key(sa_key))
        pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
        return pki


# --- the processes -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: pathlib.Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager; :attr:`kubeconfig` is an admin's."""

    def __init__(self, assets: pathlib.Path, *, workdir: pathlib.Path | None = None,
                 apiserver_args: Sequence[str] = (), controller_manager_args: Sequence[str] = (),
                 admission_policies: bool | AdmissionPolicyFlags = True) -> None:
        """``admission_policies``: True (the default) passes :func:`admission_policy_flags` of the
        binaries' version, False none (the binaries' defaults), an :class:`AdmissionPolicyFlags`
        exactly those. ``apiserver_args``, ``controller_manager_args``: extra flags, after those
        (a repeated ``--feature-gates`` or ``--runtime-config`` adds to the earlier ones)."""
        missing = missing_binaries(assets)
        if missing:
            raise ControlPlaneError(f"the assets directory {assets} lacks {', '.join(missing)} "
                                    f"(expected {', '.join(BINARIES)})")
        self.assets = assets
        self.git_version = binary_version(assets)   # "v1.32.0-beta.0"
        self.version = minor_version(self.git_version)   # (1, 32)
        if admission_policies is True:
            admission_policies = admission_policy_flags(self.version)
        elif admission_policies is False:
            admission_policies = NO_FLAGS
        self.admission_policy_flags: AdmissionPolicyFlags = admission_policies
        self._own_workdir = workdir is None
        self.workdir = workdir or pathlib.Path(tempfile.mkdtemp(prefix="envtest-"))
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.kubectl = assets / "kubectl"
        etcd_client, etcd_peer, self.port, controller_port = free_ports(4)
        self.server = f"https://127.0.0.1:{self.port}"
        self._etcd_client = etcd_client
        self._etcd_peer = etcd_peer
        self._controller_port = controller_port
        self._processes: list[_Process] = []
        self._pki: _Pki | None = None
        self._apiserver_args = [*admission_policies.apiserver, *apiserver_args]
        self._controller_manager_args = [*admission_policies.controller_manager, *controller_manager_args]

    # -- public -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start all three and wait until the API server is ready and ``default/default`` exists."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate every process (SIGKILL after a few seconds), then remove the data."""
        for process in reversed(self._processes):
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.popen.wait(10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(10)
        self._processes.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart_apiserver(self, grace: float = 30.0, *, admission_policies: bool | None = None) -> None:
        """Stop the API server and start it again on the same port (its clients reconnect).
        ``admission_policies``: False drops the flags that serve the admission-policy APIs (a
        cluster downgraded, or with their gates turned off), True puts them back; None keeps them."""
        self.stop_apiserver(grace)
        if admission_policies is not None:
            flags = set(self.admission_policy_flags.apiserver)
            extra = [arg for arg in self._apiserver_args if arg not in flags]
            self._apiserver_args = [*self.admission_policy_flags.apiserver, *extra] if admission_policies else extra
        self.start_apiserver()

    def stop_apiserver(self, grace: float = 30.0) -> None:
        """Stop the API server: SIGTERM, SIGKILL after ``grace`` seconds (as the kubelet does). It
        stops listening at once, then lingers — here ~30 s, on its long-running requests — so a
        shorter grace only shortens the test. Its port refuses connections until :meth:`start_apiserver`."""
        self._terminate("kube-apiserver", grace)

    def start_apiserver(self) -> None:
        """Start the API server again on the same port and wait until it is ready."""
        self._start_apiserver()
        self._wait(lambda: self._get("/readyz") == "ok", "kube-apiserver to be ready again", "kube-apiserver")

    def restart_etcd(self, down_for: float = 0.0) -> None:
        """Stop etcd, wait ``down_for`` seconds, start it again with the same data directory and ports;
        returns once the API server is ready again (its storage health check passes)."""
        self._terminate("etcd")
        time.sleep(down_for)
        self._start_etcd()
        self._wait(lambda: self._get("/readyz") == "ok", "kube-apiserver to be ready after etcd's restart", "etcd")

    @property
    def etcd_url(self) -> str:
        """etcd's client URL (plain HTTP on loopback; its v3 JSON gateway is under ``/v3/``)."""
        return f"http://127.0.0.1:{self._etcd_client}"

    def pid(self, name: str) -> int:
        """The pid of a running process of the plane (``etcd``, ``kube-apiserver``, ...): the bench
        reads its CPU time from /proc."""
        return next(p.popen.pid for p in self._processes if p.name == name)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail()}" for p in self._processes)

    # -- starting ---------------------------------------------------------------------------------

    def _start(self) -> None:
        self._pki = pki = _Pki.create(self.workdir / "pki")
        self._write_kubeconfig(pki)
        self._start_etcd()
        self._start_apiserver()
        self._wait(lambda: self._get("/readyz") == "ok", "kube-apiserver to be ready", "kube-apiserver")
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={self._controller_port}", "--leader-elect=false",
            f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca_crt}",
            "--use-service-account-credentials=false",
            # What needs nodes or a cloud is off; namespaces, service accounts, GC, deployments stay.
            "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service,-route,"
            "-persistentvolume-binder,-attachdetach",
            f"--cluster-signing-cert-file={pki.ca_crt}", f"--cluster-signing-key-file={pki.ca_key}",
            *self._controller_manager_args,
        ])
        self._wait(lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
                   "the ServiceAccount default/default (made by kube-controller-manager)", "kube-controller-manager")

    def _start_etcd(self) -> None:
        # "new" only applies to an empty data directory; a restart finds and keeps its data.
        self._spawn("etcd", [
            "--name", "envtest", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self._etcd_client}",
            "--advertise-client-urls", f"http://127.0.0.1:{self._etcd_client}",
            "--listen-peer-urls", f"http://127.0.0.1:{self._etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self._etcd_peer}",
            "--initial-cluster", f"envtest=http://127.0.0.1:{self._etcd_peer}",
            "--initial-cluster-state", "new", "--unsafe-no-fsync",
        ])

    def _terminate(self, name: str, grace: float = 30.0) -> None:
        index = next(i for i, p in enumerate(self._processes) if p.name == name)
        old = self._processes.pop(index)
        old.popen.terminate()
        try:
            old.popen.wait(grace)
        except subprocess.TimeoutExpired:
            old.popen.kill()
            old.popen.wait(10)

    def _start_apiserver(self) -> None:
        pki = self._pki
        assert pki is not None
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{self._etcd_client}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_crt}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_crt}",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--authorization-mode=RBAC", "--allow-privileged=true",
            *self._apiserver_args,
        ])

    def _spawn(self, name: str, args: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            # Own session: a Ctrl-C must not kill the API server before the teardown has used it.
            popen = subprocess.Popen([str(self.assets / name), *args], stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
                                     preexec_fn=die_with_parent)
        self._processes.append(_Process(name, popen, log))

    def _write_kubeconfig(self, pki: _Pki) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "envtest",
            "clusters": [{"name": "envtest", "cluster": {"server": self.server,
                                                         "certificate-authority": str(pki.ca_crt)}}],
            "users": [{"name": "admin", "user": {"client-certificate": str(pki.admin_crt),
                                                 "client-key": str(pki.admin_key)}}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "admin",
                                                         "namespace": "default"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def _get(self, path: str) -> str | None:
        """The body of an admin GET, or None when it fails (not up yet, 404, ...)."""
        assert self._pki is not None
        context = ssl.create_default_context(cafile=str(self._pki.ca_crt))
        context.load_cert_chain(str(self._pki.admin_crt), str(self._pki.admin_key))
        try:
            with urllib.request.urlopen(f"{self.server}{path}", context=context, timeout=5) as response:
                return str(response.read().decode())
        except (OSError, urllib.error.URLError):
            return None

    def _wait(self, ready: Callable[[], bool], what: str, culprit: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            dead = [p for p in self._processes if p.popen.poll() is not None]
            if dead:
                raise ControlPlaneError(f"{dead[0].name} exited with code {dead[0].popen.returncode} "
                                        f"while waiting for {what}:\n{dead[0].tail()}")
            if time.monotonic() >= deadline:
                process = next((p for p in self._processes if p.name == culprit), None)
                raise ControlPlaneError(f"timed out after {START_TIMEOUT:.0f}s waiting for {what}"
                                        + (f":\n{process.tail()}" if process else ""))
            time.sleep(0.25)


def main() -> None:
    """``python tests/e2e/envtest.py``: a control plane for a laptop with no kind, until Ctrl-C."""
    assets = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
    if not assets:
        raise SystemExit("set KUBEBUILDER_ASSETS to a directory holding " + ", ".join(BINARIES)
                         + ' (here: export KUBEBUILDER_ASSETS="$(../shared/envtest/install.sh)")')
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="envtest-"))
    try:
        plane = ControlPlane(pathlib.Path(assets), workdir=workdir)
        plane.start()
    except ControlPlaneError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        raise SystemExit(f"cannot start the control plane: {exc}") from None
    print(f"API server {plane.server} ({plane.git_version}) is ready; in another terminal:\n"
          f"  export KUBECONFIG={plane.kubeconfig}\n  export PATH={plane.assets}:$PATH   # its kubectl\n"
          "Ctrl-C stops it and removes its data.", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    main()
