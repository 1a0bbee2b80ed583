"""Helpers for the e2e tests: a real kube-apiserver reached with pykube-ng (synchronous), no fakes.

Everything here talks HTTP to the cluster named by ``$KUBECONFIG``. Requests go through pykube's
``HTTPClient`` (its session carries the kubeconfig's credentials); :func:`Cluster.call` returns the
status, the decoded body and the parsed ``Warning:`` headers, so tests can check denials, messages,
warnings and mutations exactly as the API server returns them to kubectl.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

import pykube
import pytest
import requests
import yaml
from envtest import die_with_parent
from pykube.objects import APIObject, NamespacedAPIObject

import builders
from ports import free_ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
REPORT_CRDS = ROOT / "charts" / "admission-policy-operator" / "files" / "openreports-crds.yaml"
CRD_DIR = ROOT / "crds"
CRD_FILE = CRD_DIR / "admissionpolicy.yaml"
CRD_NAME = "admissionpolicies.policy-operator.dev"
OPERATOR_MODULE = "admission_policy.operator.handlers"

FINALIZER = "policy-operator.dev/finalizer"
EXEMPT_LABEL = "policy-operator.dev/exempt"
MANAGED_BY = ("app.kubernetes.io/managed-by", "admission-policy-operator")
OWNED_LABEL = "e2e.policy-operator.dev/owned"  # on every namespace and policy the e2e creates
FIELD_MANAGER = "admission-policy-e2e"

T = TypeVar("T")


# --- which cluster -------------------------------------------------------------------------------------------

SETUP_HINT = ("KUBEBUILDER_ASSETS=\"$(setup-envtest use 1.28 -p path)\" (.ci/run sets it) to start a control plane "
              "on loopback, or KUBECONFIG=... E2E=1 for a cluster of yours (see tests/e2e/README.md)")


@dataclasses.dataclass(frozen=True)
class ClusterSource:
    """Where the e2e tests get their cluster: started from envtest assets, or an external one."""
    assets: pathlib.Path | None = None        # KUBEBUILDER_ASSETS: start a control plane
    kubeconfig: pathlib.Path | None = None    # KUBECONFIG + E2E=1: an existing, disposable cluster

    @classmethod
    def from_env(cls) -> ClusterSource | None:
        """An external cluster when asked for explicitly, else envtest assets; None when neither."""
        paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        if os.environ.get("E2E") == "1" and paths:
            # pykube reads one file; with a list, the first one is used (and given to the operator).
            return cls(kubeconfig=pathlib.Path(paths[0]).expanduser())
        assets = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
        if assets:
            return cls(assets=pathlib.Path(assets).expanduser())
        return None


@dataclasses.dataclass(frozen=True)
class E2ESettings:
    kubeconfig: pathlib.Path
    advertise_host: str          # the address the API server uses to reach the operator on this host
    operator_namespace: str
    webhook_config_name: str
    cert_secret: str
    timeout: float               # deadline of every wait
    pod_image: str
    kubectl: str                 # the kubectl binary the tests run as a user would

    @classmethod
    def from_env(cls, kubeconfig: pathlib.Path, kubectl: str | None = None) -> E2ESettings:
        return cls(
            kubeconfig=kubeconfig,
            advertise_host=os.environ.get("E2E_ADVERTISE_HOST", "").strip() or "127.0.0.1",
            operator_namespace=os.environ.get("E2E_OPERATOR_NAMESPACE", "").strip() or "admission-policy-e2e",
            webhook_config_name=os.environ.get("E2E_WEBHOOK_CONFIG_NAME", "").strip() or "admission-policy-e2e",
            cert_secret="admission-policy-e2e-tls",
            timeout=float(os.environ.get("E2E_TIMEOUT", "").strip() or 60),
            pod_image=os.environ.get("E2E_POD_IMAGE", "").strip() or "registry.k8s.io/pause:3.9",
            kubectl=kubectl or os.environ.get("E2E_KUBECTL", "").strip() or "kubectl",
        )


# --- resource classes ---------------------------------------------------------------------------------------
# Subclasses rather than pykube.object_factory: the factory reads (and caches per client) discovery,
# which does not know AdmissionPolicy until the CRD is established.

class AdmissionPolicy(APIObject):  # type: ignore[misc]
    version = "policy-operator.dev/v1alpha1"
    endpoint = "admissionpolicies"
    kind = "AdmissionPolicy"


class AdmissionPolicyException(NamespacedAPIObject):  # type: ignore[misc]
    version = "policy-operator.dev/v1alpha1"
    endpoint = "admissionpolicyexceptions"
    kind = "AdmissionPolicyException"


class NamespacedAdmissionPolicy(NamespacedAPIObject):  # type: ignore[misc]
    version = "policy-operator.dev/v1alpha1"
    endpoint = "namespacedadmissionpolicies"
    kind = "NamespacedAdmissionPolicy"


class Report(NamespacedAPIObject):  # type: ignore[misc]
    """An openreports Report: the background audit's results in one namespace."""
    version = "openreports.io/v1alpha1"
    endpoint = "reports"
    kind = "Report"


class ClusterReport(APIObject):  # type: ignore[misc]
    version = "openreports.io/v1alpha1"
    endpoint = "clusterreports"
    kind = "ClusterReport"


def chart_cluster_roles(*suffixes: str) -> list[dict[str, Any]]:
    """The chart's ClusterRoles whose names end with one of ``suffixes``, as `helm install` renders them."""
    import helm_python as helm
    sys.path.insert(0, str(ROOT / "tests" / "chart"))
    from chart_render import CHART_DIR, render
    with helm.Chart.load(CHART_DIR) as chart:
        docs = render(chart)
    return [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith(suffixes)]


def role_binding(namespace: str, role: str, user: str) -> dict[str, Any]:
    """A RoleBinding of ClusterRole ``role`` to ``user`` in ``namespace`` (the user is then impersonated)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": unique(f"e2e-{user}"[:40]), "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}


def install_report_crds(cluster: Cluster) -> None:
    """The openreports CRDs, as the chart's ``reports.installCRDs=true`` installs them (left in
    place: other tests and runs reuse them)."""
    for crd in yaml.safe_load_all(REPORT_CRDS.read_text()):
        if cluster.get(pykube.CustomResourceDefinition, crd["metadata"]["name"]).status == 404:
            created = cluster.create(pykube.CustomResourceDefinition, crd)
            assert created.ok, str(created)
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")


class ValidatingWebhookConfiguration(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1"
    endpoint = "validatingwebhookconfigurations"
    kind = "ValidatingWebhookConfiguration"


class MutatingWebhookConfiguration(APIObject):  # type: ignore[misc]
    version = "admissionregistration.k8s.io/v1"
    endpoint = "mutatingwebhookconfigurations"
    kind = "MutatingWebhookConfiguration"


class ClusterKopfPeering(APIObject):  # type: ignore[misc]
    version = "kopf.dev/v1"
    endpoint = "clusterkopfpeerings"
    kind = "ClusterKopfPeering"


# --- answers and warnings -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Answer:
    """One API response: HTTP status, decoded body, and the warnings the API server sent."""
    method: str
    url: str
    status: int
    body: Any
    warnings: list[str]

    @classmethod
    def of(cls, method: str, response: requests.Response) -> Answer:
        try:
            payload: Any = response.json()
        except ValueError:
            payload = response.text
        return cls(method, response.url, response.status_code, payload,
                   parse_warning_headers(_warning_header_values(response)))

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def obj(self) -> dict[str, Any]:
        assert self.ok and isinstance(self.body, dict), f"expected an object, got {self}"
        return self.body

    @property
    def message(self) -> str:
        if isinstance(self.body, dict):
            return str(self.body.get("message", ""))
        return str(self.body)

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", "")) if isinstance(self.body, dict) else ""

    @property
    def policy_warnings(self) -> list[str]:
        """Only the warnings our operator produces (the API server may add its own)."""
        return [w for w in self.warnings if w.startswith('AdmissionPolicy "')]

    def __str__(self) -> str:
        detail = self.message if not self.ok else "ok"
        return f"{self.method} {self.url} → {self.status} {self.reason}: {detail} (warnings: {self.warnings})"


_WARN_HEAD = re.compile(r'(\d{3}) (\S+) "')
_WARN_DATE = re.compile(r' "[^"]*"')


def parse_warning_headers(values: Iterable[str]) -> list[str]:
    """The texts of RFC 7234 ``Warning`` headers (``299 - "text"``), as Kubernetes writes them.

    A header value may carry several comma-separated warnings (HTTP clients join repeated headers);
    the text is a quoted-string with ``\\"`` and ``\\\\`` escapes, so commas inside it are content.
    """
    texts: list[str] = []
    for value in values:
        i, n = 0, len(value)
        while True:
            while i < n and value[i] in " \t,":
                i += 1
            if i >= n:
                break
            head = _WARN_HEAD.match(value, i)
            if head is None:
                raise ValueError(f"malformed Warning header at {i}: {value!r}")
            i = head.end()
            text: list[str] = []
            while i < n and value[i] != '"':
                if value[i] == "\\" and i + 1 < n:
                    i += 1
                text.append(value[i])
                i += 1
            if i >= n:
                raise ValueError(f"unterminated warning text: {value!r}")
            i += 1
            date = _WARN_DATE.match(value, i)
            if date is not None:
                i = date.end()
            texts.append("".join(text))
    return texts


def _warning_header_values(response: requests.Response) -> list[str]:
    raw_headers = getattr(response.raw, "headers", None)
    if raw_headers is not None and hasattr(raw_headers, "getlist"):
        return list(raw_headers.getlist("Warning"))  # urllib3 keeps repeated headers apart
    value = response.headers.get("Warning")
    return [value] if value else []


# --- polling ----------------------------------------------------------------------------------------------

def eventually(produce: Callable[[], T], until: Callable[[T], bool], what: str, timeout: float,
               interval: float = 0.5) -> T:
    """Call ``produce`` until ``until`` holds for its result; fail with the last result at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = produce()
        if until(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {value}")
        time.sleep(interval)


# --- the cluster ------------------------------------------------------------------------------------------

class Cluster:
    def __init__(self, settings: E2ESettings) -> None:
        self.settings = settings
        if not settings.kubeconfig.is_file():
            pytest.fail(f"KUBECONFIG: no file {settings.kubeconfig}", pytrace=False)
        config = pykube.KubeConfig.from_file(str(settings.kubeconfig))
        # Generous: a request may wait on two webhooks (5 s timeout each) when the operator is down.
        self.api = pykube.HTTPClient(config, timeout=30)

    # raw calls, returning what the API server said (status, body, warnings)

    def call(self, method: str, cls: type[APIObject], name: str | None = None, *, namespace: str | None = None,
             subresource: str | None = None, body: Any = None, params: Mapping[str, str] | None = None,
             content_type: str = "application/json") -> Answer:
        kwargs: dict[str, Any] = {
            "version": cls.version,
            "url": "/".join(part for part in (cls.endpoint, name, subresource) if part),
        }
        if issubclass(cls, NamespacedAPIObject):
            if not namespace:  # pykube would fall back to the kubeconfig's namespace: never wanted here
                raise ValueError(f"{cls.kind} is namespaced: give the namespace")
            kwargs["namespace"] = namespace
        if params:
            kwargs["params"] = dict(params)
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        return Answer.of(method, self.api.request(method, **kwargs))

    def raw(self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None) -> Answer:
        """A call on any API path (kinds pykube has no class for, discovery)."""
        response = self.api.session.request(method, self.api.url + path, params=dict(params or {}),
                                            json=body, timeout=30)
        return Answer.of(method, response)

    def create(self, cls: type[APIObject], body: Mapping[str, Any], *, dry_run: bool = False) -> Answer:
        namespace = (body.get("metadata") or {}).get("namespace")
        return self.call("POST", cls, namespace=namespace, body=body,
                         params={"dryRun": "All"} if dry_run else None)

    def get(self, cls: type[APIObject], name: str, namespace: str | None = None) -> Answer:
        return self.call("GET", cls, name, namespace=namespace)

    def merge_patch(self, cls: type[APIObject], name: str, patch: Mapping[str, Any], *,
                    namespace: str | None = None, subresource: str | None = None) -> Answer:
        return self.call("PATCH", cls, name, namespace=namespace, subresource=subresource, body=patch,
                         content_type="application/merge-patch+json")

    def delete(self, cls: type[APIObject], name: str, namespace: str | None = None) -> Answer:
        answer = self.call("DELETE", cls, name, namespace=namespace)
        assert answer.ok or answer.status == 404, f"cannot delete {cls.kind} {name}: {answer}"
        return answer

    def items(self, cls: type[APIObject], *, label_selector: str | None = None,
             namespace: str | None = None) -> list[dict[str, Any]]:
        answer = self.call("GET", cls, namespace=namespace,
                           params={"labelSelector": label_selector} if label_selector else None)
        items: list[dict[str, Any]] = answer.obj.get("items") or []
        return items

    def wait_gone(self, cls: type[APIObject], name: str, namespace: str | None = None,
                  timeout: float | None = None) -> None:
        eventually(lambda: self.get(cls, name, namespace), lambda a: a.status == 404,
                   f"{cls.kind} {name} to be gone", timeout or self.settings.timeout)

    def kubectl(self, *args: str, input: str | None = None, timeout: float | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl as a user would, against this cluster; fails with its output unless ``check=False``."""
        result = subprocess.run([self.settings.kubectl, *args], input=input, capture_output=True, text=True,
                                timeout=timeout or self.settings.timeout, check=False,
                                env={**os.environ, "KUBECONFIG": str(self.settings.kubeconfig)})
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    # setup

    def check_reachable(self) -> None:
        try:
            response = self.api.session.get(f"{self.api.url}/version", timeout=10)
        except requests.RequestException as exc:
            problem = str(exc)
        else:
            problem = "" if response.ok else f"/version answered {response.status_code}: {response.text}"
        if problem:
            pytest.fail(f"cannot use the API server of {self.settings.kubeconfig}: {problem}", pytrace=False)

    def apply_crd(self) -> None:
        """`kubectl apply --server-side -f crds/` (every CRD of the project), then wait until each is
        Established."""
        names = []
        for path in sorted(CRD_DIR.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            name = crd["metadata"]["name"]
            answer = self.call("PATCH", pykube.CustomResourceDefinition, name, body=crd,
                               params={"fieldManager": FIELD_MANAGER, "force": "true"},
                               content_type="application/apply-patch+yaml")
            assert answer.ok, f"applying {path.name} failed: {answer}"
            names.append(name)
        assert CRD_NAME in names, f"{CRD_FILE} is missing"

        def established(a: Answer) -> bool:
            conditions = (a.obj.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        for name in names:
            eventually(lambda name=name: self.get(pykube.CustomResourceDefinition, name), established,
                       f"CRD {name} to be Established", self.settings.timeout)

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """A fresh namespace where pods can be created at once (its default ServiceAccount exists)."""
        existing = self.get(pykube.Namespace, name)
        if existing.ok and existing.obj.get("metadata", {}).get("deletionTimestamp"):
            self.wait_gone(pykube.Namespace, name, timeout=self.settings.timeout * 3)
            existing = self.get(pykube.Namespace, name)
        if not existing.ok:
            body = {"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": {OWNED_LABEL: "true", **(labels or {})}}}
            answer = self.create(pykube.Namespace, body)
            assert answer.ok, f"cannot create namespace {name}: {answer}"
        # The ServiceAccount admission plugin refuses pods until the controller made "default".
        eventually(lambda: self.get(pykube.ServiceAccount, "default", name), lambda a: a.ok,
                   f"ServiceAccount default in namespace {name}", self.settings.timeout)

    def delete_webhook_configurations(self) -> None:
        """Delete both configurations named ``webhook_config_name``: each is tried, whatever the other did."""
        name = self.settings.webhook_config_name
        problems = []
        for cls in (ValidatingWebhookConfiguration, MutatingWebhookConfiguration):
            try:
                self.delete(cls, name)
            except (AssertionError, requests.RequestException) as exc:
                problems.append(str(exc))
        assert not problems, "deleting the webhook configurations failed: " + "; ".join(problems)

    def owned_policies(self) -> list[str]:
        answer = self.call("GET", AdmissionPolicy, params={"labelSelector": f"{OWNED_LABEL}=true"})
        if answer.status == 404:  # the CRD is not installed
            return []
        return [p["metadata"]["name"] for p in answer.obj.get("items") or []]


# --- policies and objects -----------------------------------------------------------------------------------

def example_policy(example: str) -> dict[str, Any]:
    """``examples/<example>/policy.yaml`` exactly as users apply it, plus our ownership label."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / example / "policy.yaml").read_text())
    body["metadata"].setdefault("labels", {})[OWNED_LABEL] = "true"
    return body


def policy_body(name: str, **spec: Any) -> dict[str, Any]:
    """``builders.policy_body`` labelled as the e2e's own, for the cleanup to find it."""
    return builders.policy_body(name, metadata={"labels": {OWNED_LABEL: "true"}}, **spec)


def example_object(example: str, filename: str, namespace: str, image: str, *, name: str | None = None
                   ) -> dict[str, Any]:
    """A sample object of an example, moved to ``namespace`` and made cheap to create.

    Container images become ``image`` (a tiny one: nothing needs to run, admission is what is tested,
    and the examples' registries do not exist). Deployments are created paused, so the controller
    starts no ReplicaSet and no pods; the policies under test do not look at ``spec.paused``.
    """
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / example / filename).read_text())
    body = copy.deepcopy(body)
    body["metadata"]["namespace"] = namespace
    if name is not None:
        body["metadata"].pop("generateName", None)
        body["metadata"]["name"] = name
    pod_spec = body["spec"]["template"]["spec"] if "template" in body.get("spec", {}) else body.get("spec", {})
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            container["image"] = image
    if body["kind"] == "Deployment":
        body["spec"]["paused"] = True
    return body


def assert_denied(answer: Answer, policy: str, *fragments: str, code: int | None = None) -> None:
    """Denied by ``policy`` through our webhook, with every fragment in the message."""
    assert not answer.ok, f"expected a denial by {policy}, but the request was allowed: {answer}"
    assert "admission webhook" in answer.message, f"not denied by an admission webhook: {answer}"
    assert f'AdmissionPolicy "{policy}" denied the request: ' in answer.message, answer.message
    for fragment in fragments:
        assert fragment in answer.message, f"{fragment!r} not in {answer.message!r}"
    if code is not None:
        assert answer.status == code, f"expected HTTP {code}: {answer}"


def unique(prefix: str, limit: int = 63) -> str:
    """``prefix-xxxxxx``, a valid DNS label of at most ``limit`` characters."""
    slug = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")
    suffix = secrets.token_hex(3)
    return f"{slug[: limit - len(suffix) - 1].rstrip('-')}-{suffix}"


# --- the operator process -----------------------------------------------------------------------------------

class Target(NamedTuple):
    """One control plane a test runs on (conftest's ``native_target``): its cluster, the operator
    running against it, and its Kubernetes version, e.g. ``(1, 28)``."""
    cluster: Cluster
    operator: OperatorProcess
    version: tuple[int, int]


class OperatorProcess:
    """``kopf run -m admission_policy.operator.handlers --all-namespaces --standalone`` on this host."""

    def __init__(self, cluster: Cluster, log_path: pathlib.Path, cert_dir: pathlib.Path, *,
                 kubeconfig: pathlib.Path | None = None, env: Mapping[str, str] | None = None,
                 standalone: bool = True) -> None:
        """``kubeconfig``: the operator's credentials (default: the tests' own, admin); ``env``: extra or
        overriding variables; ``standalone=False``: Kopf peering, as the chart runs it (AP_PEERING_NAME)."""
        self.cluster = cluster
        self.settings = cluster.settings
        self.log_path = log_path
        self.standalone = standalone
        self.listen_port, self.health_port, self.metrics_port = free_ports(3)
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig or self.settings.kubeconfig),
            "PYTHONUNBUFFERED": "1",
            "AP_NAMESPACE": self.settings.operator_namespace,
            "AP_LISTEN_HOST": "0.0.0.0",
            "AP_LISTEN_PORT": str(self.listen_port),
            "AP_ADVERTISE_HOST": self.settings.advertise_host,
            "AP_HEALTH_PORT": str(self.health_port),
            "AP_METRICS_PORT": str(self.metrics_port),
            "AP_CERT_DIR": str(cert_dir),
            "AP_CERT_SECRET": self.settings.cert_secret,
            "AP_WEBHOOK_CONFIG_NAME": self.settings.webhook_config_name,
            "AP_LOG_LEVEL": os.environ.get("E2E_OPERATOR_LOG_LEVEL", "INFO"),
            # No background audit unless a test asks for it (test_e2e_audit.py): its status and
            # report writes would otherwise race what the other tests read.
            "AP_AUDIT_INTERVAL": "0",
            # The webhooks judge every policy unless it says spec.native: Auto (test_e2e_native.py):
            # the other tests assert the operator's own answers, worded as it words them.
            "AP_NATIVE_DEFAULT": "Never",
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        # Outlives a killed pytest (the operator runs in its own session), so the next run can tell.
        # One per cluster (kubeconfig path), so that runs against separate envtest control planes coexist.
        cluster_key = hashlib.sha256(str(self.settings.kubeconfig.resolve()).encode()).hexdigest()[:8]
        self.pidfile = (pathlib.Path(tempfile.gettempdir())
                        / f"{self.settings.webhook_config_name}-{cluster_key}.e2e-operator.pid")

    @property
    def url(self) -> str:
        """What the webhook configurations name: AP_ADVERTISE_HOST and AP_ADVERTISE_PORT (else the listen port)."""
        host = self.env.get("AP_ADVERTISE_HOST") or self.settings.advertise_host
        port = self.env.get("AP_ADVERTISE_PORT") or self.listen_port
        return f"https://{f'[{host}]' if ':' in host else host}:{port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_no_leftover(self) -> None:
        """Refuse to start next to the operator of an earlier run that was killed: both would write
        the same webhook configurations."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        try:
            os.kill(pid, 0)  # signal 0: only asks whether the process exists
            alive = True
        except (ProcessLookupError, PermissionError):
            alive = False
        if alive:
            ps = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False)
            if OPERATOR_MODULE in ps.stdout:
                pytest.fail(f"the operator of an earlier e2e run is still running (pid {pid}, see {self.pidfile}); "
                            f"stop it first: kill {pid}", pytrace=False)
        self.pidfile.unlink(missing_ok=True)

    def start(self) -> None:
        """Start, then wait until /readyz answers and the API server reaches the webhook."""
        assert not self.alive(), "the operator is already running"
        with self.log_path.open("ab") as log:
            log.write(f"\n===== e2e: starting the operator ({self.url}) =====\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kopf", "run", "-m", OPERATOR_MODULE, "--all-namespaces",
                 *(["--standalone"] if self.standalone else [])],
                cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C in the terminal must not kill it before the teardown has
                # deleted the policies, whose finalizer only a live operator removes.
                start_new_session=True, preexec_fn=die_with_parent,
            )
        self.pidfile.write_text(f"{self.process.pid}\n")
        self._wait_ready()
        self._wait_reachable()

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (graceful, as Kubernetes stops a pod), SIGKILL after ``timeout``; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.pidfile.unlink(missing_ok=True)
        return self.process.returncode

    def kill(self) -> int | None:
        """SIGKILL, as the OOM killer or a lost node stops a pod: no cleanup handler runs; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.pidfile.unlink(missing_ok=True)
        return self.process.returncode

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no operator log)"
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, message: str) -> None:
        pytest.fail(f"{message}\n--- operator log ({self.log_path}), last lines ---\n{self.log_tail()}",
                    pytrace=False)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.timeout
        last = "no answer yet"
        while True:
            if not self.alive():
                assert self.process is not None
                self._fail(f"the operator exited with code {self.process.returncode} before it was ready")
            try:
                response = requests.get(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except requests.RequestException as exc:
                last = repr(exc)
            if time.monotonic() >= deadline:
                self._fail(f"the operator's /readyz was not 200 within {self.settings.timeout:.0f}s: {last}")
            time.sleep(0.5)

    def _wait_reachable(self) -> None:
        """The API server calls our policy webhook: a dry-run create of an invalid policy is refused by it.

        Dry-run, so that nothing is stored while the configuration is not yet in effect.
        """
        name = self.settings.webhook_config_name
        cluster = self.cluster
        try:
            eventually(lambda: cluster.get(ValidatingWebhookConfiguration, name), lambda a: a.ok,
                       f"ValidatingWebhookConfiguration {name} to be written", self.settings.timeout)
        except AssertionError as exc:
            self._fail(str(exc))
        probe = policy_body("e2e-reachability-probe", match={"resources": [builders.CREATE_POD_RULE]},
                            validations=[{"expression": "object.metadata.name.startsWith(", "message": "probe"}])
        deadline = time.monotonic() + self.settings.timeout
        while True:
            if not self.alive():
                assert self.process is not None
                self._fail(f"the operator exited with code {self.process.returncode}")
            answer = cluster.create(AdmissionPolicy, probe, dry_run=True)
            if 400 <= answer.status < 500 and "admission webhook" in answer.message:  # refused by the operator
                return
            if time.monotonic() >= deadline:
                self._fail(
                    f"the API server does not reach the operator's webhook at {self.url} "
                    f"within {self.settings.timeout:.0f}s; last answer: {answer}\n"
                    "When the API server runs in a container (kind), set E2E_ADVERTISE_HOST to an address "
                    "of this host that the container can reach (see tests/e2e/README.md).")
            time.sleep(1)


# --- a policy on ConfigMaps that both webhook configurations route (the stop and hardening tests) -------

GUARD = "e2e-configmap-guard"
GUARDED = "e2e.policy-operator.dev/guarded"
MUTATED = "e2e.policy-operator.dev/mutated"


def guard_policy() -> dict[str, Any]:
    """Validates and mutates labelled ConfigMaps; both webhook configurations then route ConfigMaps."""
    body: dict[str, Any] = policy_body(
        GUARD,
        description="e2e: ConfigMaps labelled guarded are checked and marked",
        enforcement="Enforce",
        failurePolicy="Fail",
        match={
            "resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                           "operations": ["CREATE", "UPDATE"]}],
            "objectSelector": {"matchLabels": {GUARDED: "true"}},
        },
        validations=[{"expression": "!object.metadata.name.startsWith('forbidden-')",
                      "message": "configmap names must not start with forbidden-", "reason": "Forbidden"}],
        mutations=[{"name": "mark", "merge": {"metadata": {"labels": {MUTATED: "true"}}}}],
    )
    return body


def configmap(namespace: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return builders.configmap(name, namespace=namespace, labels=labels or {}, data={"e2e": "yes"})


def cli() -> list[str]:
    script = pathlib.Path(sys.executable).parent / "admission-policy"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from admission_policy.command import main; main()"]


# --- policies under test ------------------------------------------------------------------------------------

class Policies:
    """AdmissionPolicies a test applies; the fixture deletes them afterwards and waits until gone."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.names: list[str] = []

    def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create, then wait until the operator reports it Active for this generation."""
        name = body["metadata"]["name"]
        self.names.append(name)
        answer = self.cluster.create(AdmissionPolicy, body)
        assert answer.ok, f"creating AdmissionPolicy {name} failed: {answer}"
        return self.wait_active(name)

    def apply_example(self, example: str) -> dict[str, Any]:
        return self.apply(example_policy(example))

    def wait_active(self, name: str) -> dict[str, Any]:
        def active(answer: Answer) -> bool:
            if not answer.ok:
                return False
            body = answer.obj
            status = body.get("status") or {}
            if status.get("observedGeneration") != body["metadata"].get("generation"):
                return False
            if status.get("phase") in ("Failed", "Degraded"):
                raise AssertionError(f"AdmissionPolicy {name} went {status['phase']}: {status.get('conditions')}")
            return status.get("phase") == "Active"
        answer = eventually(lambda: self.cluster.get(AdmissionPolicy, name), active,
                            f"AdmissionPolicy {name} to be Active", self.cluster.settings.timeout)
        return answer.obj

    def delete(self, name: str) -> None:
        """Delete and wait until it is gone (the operator unroutes it, then releases the finalizer)."""
        self.cluster.delete(AdmissionPolicy, name)
        self.cluster.wait_gone(AdmissionPolicy, name)

    def delete_all(self) -> None:
        for name in dict.fromkeys(reversed(self.names)):
            self.cluster.delete(AdmissionPolicy, name)
        for name in dict.fromkeys(self.names):
            self.cluster.wait_gone(AdmissionPolicy, name)


def vap_version(cluster: Cluster) -> str:
    """The ValidatingAdmissionPolicy version the cluster serves (v1, else v1beta1); fails without one."""
    for version in ("v1", "v1beta1"):
        answer = cluster.raw("GET", f"/apis/admissionregistration.k8s.io/{version}")
        if answer.ok and any(r.get("name") == "validatingadmissionpolicies" for r in answer.obj.get("resources", [])):
            return version
    pytest.fail("the control plane serves no ValidatingAdmissionPolicy API")

