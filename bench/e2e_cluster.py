"""The cluster side of bench/e2e.py: the envtest control plane, what is stored in it, operator replicas.

The control plane is the e2e tests' own (tests/e2e/envtest.py, imported, not copied), and so is
the proxy that puts two replicas behind one address (tests/e2e/replicas.py's TcpProxy). The
operator runs as the in-process bench runs it (bench/servers.py: the image's entry point,
``admission-policy run --standalone``, test-only packages hidden), pinned to a core of its own.
Setup calls go through a small synchronous client with the admin's certificate.
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import time
from collections.abc import Iterable
from typing import IO, Any, Final

import requests
import yaml

from common import HOST, REPO, free_port
from procs import Child, ChildError

sys.path.insert(0, str(REPO / "tests"))   # tests/builders.py, which e2e_kube imports
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from envtest import ControlPlane, ControlPlaneError  # the test harness, reused

__all__ = ["Api", "ControlPlane", "ControlPlaneError", "Replica", "SetupError"]

OPERATOR_NAMESPACE: Final = "admission-policy-bench"
WEBHOOK_CONFIG: Final = "admission-policy-bench"
CERT_SECRET: Final = "admission-policy-bench-tls"
CRD_FILE: Final = REPO / "crds" / "admissionpolicy.yaml"
POLICIES: Final = "/apis/policy-operator.dev/v1alpha1/admissionpolicies"
CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GENERATED: Final = "app.kubernetes.io/managed-by=admission-policy-operator"   # native enforcement's objects
PROBE: Final = "admission-policy-operator.probe"   # the operator's sentinel pair (docs/vap.md)
# status.native reasons that will not turn into Native without a change: waiting is pointless.
STAYS_ON_WEBHOOK: Final = frozenset({"Disabled", "APIUnavailable", "NotPortable", "Exception"})


class SetupError(RuntimeError):
    """The cluster did not get into the state a scenario needs (the message says which)."""


class Api:
    """Admin calls to the API server: what the setup needs, nothing more."""

    def __init__(self, kubeconfig: pathlib.Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        self.server: str = cluster["server"]
        self.ca: str = cluster["certificate-authority"]
        self.cert: str = user["client-certificate"]
        self.key: str = user["client-key"]
        self.session = requests.Session()
        self.session.trust_env = False   # else REQUESTS_CA_BUNDLE, if set, wins over our CA
        self.session.verify = self.ca
        self.session.cert = (self.cert, self.key)

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> \
            tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        response = self.session.request(method, self.server + path, data=data, timeout=30,
                                        headers={"Content-Type": content_type})
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def create(self, path: str, body: dict[str, Any]) -> None:
        status, answer = self.call("POST", path, body)
        if status not in (200, 201, 409):
            raise SetupError(f"POST {path} {body['metadata']['name']}: HTTP {status}: {answer}")

    def patch(self, path: str, body: dict[str, Any]) -> None:
        status, answer = self.call("PATCH", path, body, "application/merge-patch+json")
        if status != 200:
            raise SetupError(f"PATCH {path}: HTTP {status}: {answer}")

    def delete(self, path: str) -> None:
        status, answer = self.call("DELETE", path)
        if status not in (200, 202, 404):
            raise SetupError(f"DELETE {path}: HTTP {status}: {answer}")

    def wait(self, what: str, ready: Any, timeout: float = 120.0, interval: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise SetupError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    # --- what the scenarios need ------------------------------------------------------------

    def ensure_namespace(self, name: str) -> None:
        self.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        # The ServiceAccount admission plugin refuses Pods until the controller made "default".
        self.wait(f"ServiceAccount default in {name}",
                  lambda: self.call("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200)

    def apply_crds(self, bodies: Iterable[dict[str, Any]]) -> None:
        names = []
        for body in bodies:
            self.create(CRDS, body)
            names.append(body["metadata"]["name"])

        def established(name: str) -> bool:
            status, answer = self.call("GET", f"{CRDS}/{name}")
            conditions = (answer.get("status") or {}).get("conditions") or [] if status == 200 else []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
        for name in names:
            self.wait(f"CRD {name} to be Established", lambda name=name: established(name))

    def admission_policy_crd(self) -> dict[str, Any]:
        body: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
        return body

    def wait_active(self, names: Iterable[str], timeout: float) -> float:
        """Until every named AdmissionPolicy is Active for its generation; returns the seconds taken."""
        wanted = set(names)
        started = time.monotonic()
        phases: dict[str, int] = {}

        def all_active() -> bool:
            status, answer = self.call("GET", POLICIES)
            if status != 200:
                return False
            phases.clear()
            active = set()
            for item in answer.get("items") or []:
                state = item.get("status") or {}
                phase = state.get("phase") or "none"
                phases[phase] = phases.get(phase, 0) + 1
                if phase in ("Failed", "Degraded") and item["metadata"]["name"] in wanted:
                    raise SetupError(f"AdmissionPolicy {item['metadata']['name']} went {phase}: "
                                     f"{state.get('conditions')}")
                if phase == "Active" and state.get("observedGeneration") == item["metadata"].get("generation"):
                    active.add(item["metadata"]["name"])
            return wanted <= active
        try:
            self.wait(f"{len(wanted)} AdmissionPolicies to be Active", all_active, timeout, interval=1.0)
        except SetupError as exc:
            raise SetupError(f"{exc} (phases: {phases})") from None
        return round(time.monotonic() - started, 1)


    def wait_enforced_by(self, names: Iterable[str], enforced_by: str, timeout: float) -> float:
        """Until every named AdmissionPolicy's ``status.native`` says ``enforced_by`` (Native or Webhook) for
        its generation; returns the seconds taken. A policy that stays on the webhook for a reason that
        will not change (e.g. the API server refused a generated object) fails at once, quoting it."""
        wanted = set(names)
        started = time.monotonic()
        last: dict[str, dict[str, Any]] = {}
        stuck: list[str] = []

        def done() -> bool:
            status, answer = self.call("GET", POLICIES)
            if status != 200:
                return False
            reached = set()
            for item in answer.get("items") or []:
                name = item["metadata"]["name"]
                if name not in wanted:
                    continue
                native = last[name] = (item.get("status") or {}).get("native") or {}
                if native.get("generation") != item["metadata"].get("generation"):
                    continue   # not yet decided for this spec
                if native.get("enforcedBy") == enforced_by:
                    reached.add(name)
                elif enforced_by == "Native" and native.get("reason") in STAYS_ON_WEBHOOK:
                    stuck.append(f"AdmissionPolicy {name} stays on the webhook: status.native.reason "
                                 f"{native.get('reason')}: {native.get('message')}")
            return bool(stuck) or wanted <= reached
        try:
            self.wait(f"{len(wanted)} AdmissionPolicies to be enforced by {enforced_by}", done, timeout, 1.0)
        except SetupError as exc:
            fields = ("enforcedBy", "reason", "message", "generation")
            seen = {n: {k: v.get(k) for k in fields} for n, v in last.items()}
            raise SetupError(f"{exc} (status.native: {seen})") from None
        if stuck:
            raise SetupError("; ".join(stuck))
        return round(time.monotonic() - started, 1)

    def generated(self, api_version: str) -> list[dict[str, Any]]:
        """The ValidatingAdmissionPolicies native enforcement wrote (the probe's sentinel left out)."""
        status, answer = self.call("GET", f"/apis/{api_version}/validatingadmissionpolicies?labelSelector={GENERATED}")
        if status != 200:
            raise SetupError(f"listing the generated ValidatingAdmissionPolicies: HTTP {status}: {answer}")
        return [item for item in answer.get("items") or [] if item["metadata"]["name"] != PROBE]


class Replica:
    """One operator process, pinned to ``core``; every replica shares the certificate Secret, so
    any of them can answer behind one address (``advertise_port``: the proxy's)."""

    def __init__(self, name: str, core: int, kubeconfig: pathlib.Path, workdir: pathlib.Path, log: IO[str], *,
                 advertise_port: int | None = None, native_default: str = "Never") -> None:
        self.name = name
        self.listen_port, self.health_port = free_port(), free_port()
        cert_dir = workdir / f"certs-{name}"
        env = {
            "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1",
            "AP_NAMESPACE": OPERATOR_NAMESPACE, "AP_WEBHOOK_CONFIG_NAME": WEBHOOK_CONFIG, "AP_CERT_SECRET": CERT_SECRET,
            "AP_LISTEN_HOST": HOST, "AP_LISTEN_PORT": str(self.listen_port), "AP_ADVERTISE_HOST": HOST,
            "AP_ADVERTISE_PORT": str(advertise_port or self.listen_port), "AP_HEALTH_PORT": str(self.health_port),
            "AP_METRICS_PORT": str(free_port()), "AP_CERT_DIR": str(cert_dir), "AP_POD_NAME": name,
            "AP_LOG_LEVEL": "INFO",
            # Never: the webhook path, unless a policy says spec.native: Auto (the "native" scenario).
            "AP_NATIVE_DEFAULT": native_default,
        }
        self.child = Child(name, "servers.py", ["operator", "--core", str(core)], env=env, log=log)

    @property
    def pid(self) -> int:
        return self.child.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.child.proc.poll() is not None:
                raise ChildError(f"{self.name}: exited with code {self.child.proc.returncode} (see the log)")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"http://{HOST}:{self.health_port}/readyz", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ChildError(f"{self.name}: /readyz not 200 after {timeout:.0f}s")
            time.sleep(0.3)

    def stop(self) -> None:
        self.child.stop()
