"""The node tier: the chart installed with Helm on a real single-node Kubernetes, Pods running.

The node (containerd, runc, a kubelet and a scheduler beside a control plane) comes from the
node kit beside the repository (``../shared/node``): started once per session, given the image
built from the project's own ``Dockerfile`` (buildah, no registry: the Dockerfile's
``python:3.11-slim`` is served by a locally built Debian + Python base), stopped at the end
(``KNODE_KEEP=1`` keeps it for the next session). It needs root; without root or the kit the
tier skips with one line, except under ``CI=true``, where it fails, as the envtest tier does.

What the kit cannot exercise is listed in tests/e2e/README.md ("The node tier").
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Iterator

import helm_python as helm
import pytest
from knode import (
    BASE,
    CHART,
    IMAGE_REPOSITORY,
    IMAGE_TAG,
    KIT,
    NAMESPACE,
    RELEASE,
    REPO,
    VALUES,
    Node,
    build_image,
    kit,
)


@pytest.fixture(scope="session")
def node() -> Iterator[dict[str, str]]:
    """KUBECONFIG and PATH (kubectl v1.28.7) of a running node that has the project's image."""
    if os.geteuid() != 0 or not (KIT / "up.sh").is_file():
        reason = f"the node tier needs root and the node kit at {KIT}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    env: dict[str, str] = {}
    for line in kit("up.sh").splitlines():          # export KUBECONFIG=...  /  export PATH=...:"$PATH"
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = os.path.expandvars(shlex.split(value)[0])
    kit("image.sh", "debian-python", BASE, "--if-missing")
    build_image(REPO, f"{IMAGE_REPOSITORY}:{IMAGE_TAG}")
    try:
        yield env
    finally:
        if os.environ.get("KNODE_KEEP") != "1":
            kit("down.sh")


@pytest.fixture(scope="session")
def cluster(node: dict[str, str]) -> Node:
    return Node(node)


@pytest.fixture(scope="session")
def installed(cluster: Node) -> Iterator[Node]:
    """The chart installed with `helm install --wait` (both replicas Ready); uninstalled at the end
    unless a test already did (test_helm_uninstall_leaves_nothing_behind)."""
    with helm.Chart.load(CHART) as chart:
        cluster.helm().install(chart, RELEASE, dict(VALUES), namespace=NAMESPACE, create_namespace=True,
                               wait="watcher", timeout=300)
    try:
        yield cluster
    finally:
        if RELEASE in [release["name"] for release in cluster.helm().list()]:
            cluster.helm().uninstall(RELEASE, wait="watcher", timeout=180)
