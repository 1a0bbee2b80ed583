"""Fixtures for the e2e tests against a real API server.

The cluster: a control plane started from ``$KUBEBUILDER_ASSETS`` (etcd, kube-apiserver,
kube-controller-manager on loopback; ``.ci/run`` sets it, so every CI run has one), or an external
one named by ``KUBECONFIG`` with ``E2E=1``. With neither, the tests skip with one line saying how
to enable them, except under ``CI=true``, where they fail: CI must never pass without them.

Session: the CRD applied (Established), the operator running as a ``kopf run`` subprocess that
advertises ``https://$E2E_ADVERTISE_HOST:PORT`` to the API server, ready and reachable. The
teardown ALWAYS runs — also when the setup fails half-way — and removes whatever could block
the cluster, in this order: the e2e's policies (while the operator still runs: their finalizer
needs it), the operator, both webhook configurations by name, any policy left (finalizer
forced off), the e2e's namespaces; a started control plane is stopped last.

The secondary plane: a second envtest control plane of another Kubernetes version, for the tests
that must hold on both (1.28's ValidatingAdmissionPolicy ``v1beta1``; 1.32's ``v1`` and
MutatingAdmissionPolicy ``v1alpha1``). Started only when a test asks for it — ``secondary_plane``,
``secondary_cluster``, ``secondary_operator``, or ``native_target`` with its ``secondary`` param —
from ``$E2E_SECONDARY_ASSETS``, else from the shared envtest bundle of the other version (1.32, or
1.28 when the primary is 1.32). Its operator is set up and torn down as the primary's. When it
cannot be started, its tests skip with one line saying why, and fail under ``CI=true``.

A module runs its tests on both planes with ``native_target`` (a :class:`e2e_kube.Target`:
cluster, operator, version), and ``target_namespace``/``target_policies`` on that plane::

    def test_something(native_target: Target, target_namespace: Callable[..., str]) -> None:
        cluster, operator, version = native_target

Only on one plane: ``@pytest.mark.parametrize("native_target", ["secondary"], indirect=True)``.
"""
from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import subprocess
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import NoReturn

import pykube
import pytest
from e2e_kube import (
    MANAGED_BY,
    OWNED_LABEL,
    SETUP_HINT,
    AdmissionPolicy,
    Cluster,
    ClusterSource,
    E2ESettings,
    OperatorProcess,
    Policies,
    Target,
    ValidatingWebhookConfiguration,
    eventually,
    unique,
)
from envtest import ControlPlane, ControlPlaneError, binary_version, minor_version
from traffic import REPORTED

E2E_DIR = pathlib.Path(__file__).resolve().parent
OPERATOR_KEY = pytest.StashKey[OperatorProcess]()
SECONDARY_OPERATOR_KEY = pytest.StashKey[OperatorProcess]()
SECONDARY_KEY = pytest.StashKey[str]()   # "v1.32.0-beta.0 from /path", for the summary line
# The shared envtest bundle next to the repository (only the harness may locate it): install.sh
# [VERSION] installs one and prints its directory.
ENVTEST_INSTALL = E2E_DIR.parents[2] / "shared" / "envtest" / "install.sh"
SECONDARY_HINT = ("E2E_SECONDARY_ASSETS=<a directory of etcd, kube-apiserver, kube-controller-manager, kubectl "
                  "of another Kubernetes version> (.ci/run sets it; see tests/e2e/README.md)")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(message: str) -> NoReturn:
    """Skip with one line; under CI=true, fail instead: CI must run every tier it has."""
    if _in_ci():
        pytest.fail(f"CI=true but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane | None]:
    """The envtest control plane this session started, or None for an external cluster."""
    source = ClusterSource.from_env()
    if source is None:
        _unavailable(f"the e2e suite has no API server: {SETUP_HINT}")
    if source.assets is None:
        yield None
        return
    try:
        plane = ControlPlane(source.assets)   # admission policies on, as the binaries' version needs
        plane.start()
    except ControlPlaneError as exc:
        pytest.fail(f"cannot start the envtest control plane from KUBEBUILDER_ASSETS={source.assets}: {exc}",
                    pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def e2e_settings(control_plane: ControlPlane | None) -> E2ESettings:
    if control_plane is not None:
        return E2ESettings.from_env(control_plane.kubeconfig, kubectl=str(control_plane.kubectl))
    source = ClusterSource.from_env()
    assert source is not None and source.kubeconfig is not None
    return E2ESettings.from_env(source.kubeconfig)


@pytest.fixture(scope="session")
def cluster(e2e_settings: E2ESettings) -> Cluster:
    cluster = Cluster(e2e_settings)
    cluster.check_reachable()
    return cluster


@pytest.fixture(scope="session")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The operator, running against the cluster for the whole session."""
    yield from _session_operator(cluster, tmp_path_factory.mktemp("operator"), request.config.stash, OPERATOR_KEY)


def _session_operator(cluster: Cluster, workdir: pathlib.Path, stash: pytest.Stash,
                      key: pytest.StashKey[OperatorProcess]) -> Iterator[OperatorProcess]:
    """An operator against ``cluster`` until the generator is closed, then the cleanup (module docstring)."""
    _preflight(cluster)
    (workdir / "certs").mkdir()
    op = OperatorProcess(cluster, workdir / "operator.log", workdir / "certs")
    op.check_no_leftover()
    stash[key] = op
    stuck: list[str] = []
    with contextlib.ExitStack() as teardown:
        # Callbacks run last-registered first, each even if an earlier one failed.
        teardown.callback(_delete_namespaces, cluster)
        teardown.callback(_force_remove_policies, cluster, stuck)
        teardown.callback(cluster.delete_webhook_configurations)
        teardown.callback(op.stop)
        teardown.callback(_delete_policies, cluster, stuck)

        cluster.delete_webhook_configurations()  # left by a run that was killed
        cluster.apply_crd()
        cluster.create_namespace(cluster.settings.operator_namespace)
        op.start()
        _delete_policies(cluster, stuck)  # left by a run that was killed; the live operator releases them
        yield op


@pytest.fixture
def policies(cluster: Cluster, operator: OperatorProcess) -> Iterator[Policies]:
    """Apply policies with ``policies.apply_example(name)``; deleted (and gone) after the test."""
    applied = Policies(cluster)
    yield applied
    applied.delete_all()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """``namespace(labels)`` → the name of a fresh namespace for this test, deleted afterwards."""
    yield from _namespaces(cluster, request)


def _namespaces(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    created: list[str] = []

    def make(labels: Mapping[str, str] | None = None) -> str:
        test_name: str = request.node.originalname
        name = unique(f"ap-e2e-{test_name.removeprefix('test_')}", limit=50)
        created.append(name)
        cluster.create_namespace(name, labels)
        return name

    yield make
    for name in created:
        cluster.delete(pykube.Namespace, name)


# --- the secondary plane: another Kubernetes version, started on demand ------------------------------------

def _secondary_assets() -> pathlib.Path:
    """``$E2E_SECONDARY_ASSETS``, else the shared bundle of the version the primary is not (install.sh)."""
    assets = os.environ.get("E2E_SECONDARY_ASSETS", "").strip()
    if assets:
        return pathlib.Path(assets).expanduser()
    if not os.access(ENVTEST_INSTALL, os.X_OK):
        _unavailable(f"the tests on a second control plane have none: {SECONDARY_HINT}")
    primary = ClusterSource.from_env()
    wanted = "1.32"
    if primary is not None and primary.assets is not None:
        with contextlib.suppress(ControlPlaneError, ValueError):
            if minor_version(binary_version(primary.assets)) >= (1, 32):
                wanted = "1.28"
    result = subprocess.run([str(ENVTEST_INSTALL), wanted], capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        _unavailable(f"the second control plane cannot be installed ({ENVTEST_INSTALL} {wanted} exited "
                     f"{result.returncode}: {result.stderr.strip()[-300:]}); or set {SECONDARY_HINT}")
    return pathlib.Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def secondary_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A second envtest control plane, of another version than the primary's (see the module docstring)."""
    assets = _secondary_assets()
    try:
        plane = ControlPlane(assets)
        plane.start()
    except ControlPlaneError as exc:
        _unavailable(f"the second control plane cannot start from {assets}: {exc}")
    request.config.stash[SECONDARY_KEY] = f"{plane.git_version} from {assets}"
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def secondary_cluster(secondary_plane: ControlPlane) -> Cluster:
    """The secondary plane's :class:`Cluster`: the CRDs applied, the operator's namespace created."""
    settings = E2ESettings.from_env(secondary_plane.kubeconfig, kubectl=str(secondary_plane.kubectl))
    cluster = Cluster(settings)
    cluster.check_reachable()
    cluster.apply_crd()
    cluster.create_namespace(settings.operator_namespace)
    return cluster


@pytest.fixture(scope="session")
def secondary_operator(secondary_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
                       request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The operator against the secondary plane, set up and torn down as the session's ``operator``."""
    yield from _session_operator(secondary_cluster, tmp_path_factory.mktemp("secondary-operator"),
                                 request.config.stash, SECONDARY_OPERATOR_KEY)


@pytest.fixture(params=["primary", "secondary"])
def native_target(request: pytest.FixtureRequest) -> Target:
    """Each test twice: on the session's cluster and on the secondary plane (started on first use).
    The version is the control plane's binaries' (an external cluster's: its /version)."""
    if request.param == "primary":
        plane: ControlPlane | None = request.getfixturevalue("control_plane")
        cluster: Cluster = request.getfixturevalue("cluster")
        operator: OperatorProcess = request.getfixturevalue("operator")
        version = plane.version if plane is not None else _server_version(cluster)
        return Target(cluster, operator, version)
    if request.param == "secondary":
        secondary: ControlPlane = request.getfixturevalue("secondary_plane")
        return Target(request.getfixturevalue("secondary_cluster"), request.getfixturevalue("secondary_operator"),
                      secondary.version)
    raise ValueError(f"native_target: unknown plane {request.param!r} (primary, secondary)")


@pytest.fixture
def target_namespace(native_target: Target, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """``namespace`` on the ``native_target``'s cluster."""
    yield from _namespaces(native_target.cluster, request)


@pytest.fixture
def target_policies(native_target: Target) -> Iterator[Policies]:
    """``policies`` on the ``native_target``'s cluster (enforced by its operator)."""
    applied = Policies(native_target.cluster)
    yield applied
    applied.delete_all()


def _server_version(cluster: Cluster) -> tuple[int, int]:
    response = cluster.api.session.get(f"{cluster.api.url}/version", timeout=10)
    response.raise_for_status()
    return minor_version(response.json()["gitVersion"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line saying how many e2e tests ran, and against what (CI's log shows it)."""
    counts: dict[str, int] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        reports = terminalreporter.stats.get(outcome, [])
        counts[outcome] = len({r.nodeid for r in reports if r.nodeid.startswith("tests/e2e/")})
    if any(counts.values()):
        source = ClusterSource.from_env()
        text = ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count)
        if source is None:
            terminalreporter.write_line(f"e2e tests without an API server ({text}); to run them: {SETUP_HINT}")
            return
        against = f"an envtest control plane from {source.assets}" if source.assets else str(source.kubeconfig)
        secondary = terminalreporter.config.stash.get(SECONDARY_KEY, None)
        if secondary:
            against += f" and a secondary plane ({secondary})"
        terminalreporter.write_line(f"e2e tests against {against}: {text}")
    for figures in REPORTED:   # the reliability scenarios' figures (issue 12)
        terminalreporter.write_line(figures.line())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing e2e test shows the operator's log tail in its report."""
    report = yield
    if not report.failed or E2E_DIR not in item.path.parents:
        return report
    op = item.config.stash.get(OPERATOR_KEY, None)
    secondary = item.config.stash.get(SECONDARY_OPERATOR_KEY, None)
    callspec = getattr(item, "callspec", None)
    on_secondary = ("secondary_operator" in getattr(item, "fixturenames", ())
                    or (callspec is not None and callspec.params.get("native_target") == "secondary"))
    if on_secondary and secondary is not None:
        report.sections.append((f"secondary operator log ({secondary.log_path}), last lines", secondary.log_tail()))
    elif op is not None:
        report.sections.append((f"operator log ({op.log_path}), last lines", op.log_tail()))
    return report


# --- session setup and teardown steps -----------------------------------------------------------------------

def _preflight(cluster: Cluster) -> None:
    """Refuse a cluster where another admission-policy operator or someone's policies would interfere."""
    listed = cluster.call("GET", AdmissionPolicy)
    if listed.ok:  # 404: the CRD is not installed yet
        foreign = [p["metadata"]["name"] for p in listed.obj.get("items") or []
                   if (p["metadata"].get("labels") or {}).get(OWNED_LABEL) != "true"]
        if foreign:
            pytest.fail(f"the cluster already has AdmissionPolicies not created by the e2e tests: {foreign}. "
                        "Run the e2e tests on a dedicated cluster (see tests/e2e/README.md).", pytrace=False)
    others = [c["metadata"]["name"] for c in cluster.items(ValidatingWebhookConfiguration,
                                                          label_selector="=".join(MANAGED_BY))
              if c["metadata"]["name"] != cluster.settings.webhook_config_name]
    if others:
        pytest.fail(f"another admission-policy operator is installed (webhook configurations {others}); "
                    "uninstall it or use a dedicated cluster (see tests/e2e/README.md).", pytrace=False)


def _delete_policies(cluster: Cluster, stuck: list[str]) -> None:
    """Delete every e2e policy and wait until gone; the ones that stay are noted for the forced step."""
    names = cluster.owned_policies()
    for name in names:
        cluster.delete(AdmissionPolicy, name)
    for name in names:
        try:
            cluster.wait_gone(AdmissionPolicy, name)
        except AssertionError:
            stuck.append(name)


def _force_remove_policies(cluster: Cluster, stuck: list[str]) -> None:
    """After the operator stopped and its configurations are gone: nothing of ours may stay behind."""
    left = cluster.owned_policies()
    for name in left:
        cluster.delete(AdmissionPolicy, name)
        # An UPDATE: retried while the API server still has the deleted policy webhook cached.
        release = functools.partial(cluster.merge_patch, AdmissionPolicy, name, {"metadata": {"finalizers": None}})
        eventually(release, lambda a: a.ok or a.status == 404, f"the finalizer of AdmissionPolicy {name} to be removed",
                   cluster.settings.timeout)
        cluster.wait_gone(AdmissionPolicy, name)
    if left or stuck:
        raise AssertionError(
            f"AdmissionPolicies {sorted(set(left) | set(stuck))} were not released by the running operator; "
            "the teardown removed their finalizer (see the operator log)")


def _delete_namespaces(cluster: Cluster) -> None:
    names = {cluster.settings.operator_namespace}
    names |= {ns["metadata"]["name"] for ns in cluster.items(pykube.Namespace, label_selector=f"{OWNED_LABEL}=true")}
    for name in sorted(names):
        cluster.delete(pykube.Namespace, name)

