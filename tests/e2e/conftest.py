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
"""
from __future__ import annotations

import contextlib
import functools
import os
import pathlib
from collections.abc import Callable, Generator, Iterator, Mapping

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
    ValidatingWebhookConfiguration,
    eventually,
    unique,
)
from envtest import VALIDATING_ADMISSION_POLICY_ARGS, ControlPlane, ControlPlaneError
from traffic import REPORTED

E2E_DIR = pathlib.Path(__file__).resolve().parent
OPERATOR_KEY = pytest.StashKey[OperatorProcess]()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane | None]:
    """The envtest control plane this session started, or None for an external cluster."""
    source = ClusterSource.from_env()
    if source is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true but the e2e suite has no API server: {SETUP_HINT}", pytrace=False)
        pytest.skip(f"e2e needs a real API server: {SETUP_HINT}")
    if source.assets is None:
        yield None
        return
    try:
        plane = ControlPlane(source.assets, apiserver_args=VALIDATING_ADMISSION_POLICY_ARGS)
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
    _preflight(cluster)
    workdir = tmp_path_factory.mktemp("operator")
    (workdir / "certs").mkdir()
    op = OperatorProcess(cluster, workdir / "operator.log", workdir / "certs")
    op.check_no_leftover()
    request.config.stash[OPERATOR_KEY] = op
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
        terminalreporter.write_line(f"e2e tests against {against}: {text}")
    for figures in REPORTED:   # the reliability scenarios' figures (issue 12)
        terminalreporter.write_line(figures.line())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing e2e test shows the operator's log tail in its report."""
    report = yield
    op = item.config.stash.get(OPERATOR_KEY, None)
    if report.failed and op is not None and E2E_DIR in item.path.parents:
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

