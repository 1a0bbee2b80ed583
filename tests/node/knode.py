"""kubectl, Helm and the node kit, for the node tier's tests (fixtures in conftest.py)."""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import helm_python as helm

REPO = pathlib.Path(__file__).resolve().parents[2]
KIT = REPO.parent / "shared" / "node"
BASE = "localhost/knode/python:3.11-bookworm"       # stands in for the Dockerfile's python:3.11-slim
IMAGE_REPOSITORY, IMAGE_TAG = "localhost/admission-policy-operator", "node-tier"
RELEASE, NAMESPACE = "apo", "apo-system"
CHART = REPO / "charts" / "admission-policy-operator"
# What the chart is installed with: the local image, never pulled, and the Pods the
# protect-drained-pods example reads from its cache.
VALUES: Mapping[str, Any] = {
    "image": {"repository": IMAGE_REPOSITORY, "tag": IMAGE_TAG, "pullPolicy": "Never"},
    "rbac": {"contextResources": [{"apiGroups": [""], "resources": ["pods"]}]},
}


def build_image(context: pathlib.Path, tag: str, *args: str) -> None:
    """A Dockerfile built as `docker build` would, by buildah, with python:3.11-slim served locally."""
    kit("image.sh", "dockerfile", str(context), tag, "--base", f"python:3.11-slim={BASE}", "--host-certs", *args)


def kit(script: str, *args: str) -> str:
    """A kit script's stdout; its log passes through to stderr (pytest shows it on failure)."""
    return subprocess.run(["bash", str(KIT / script), *args], check=True, stdout=subprocess.PIPE,
                          text=True).stdout


class Node:
    """kubectl and Helm against the node, as a user would run them."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = {**os.environ, **env}
        self.kubeconfig = env["KUBECONFIG"]

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, input=stdin,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {shlex.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: Mapping[str, Any] | Sequence[Mapping[str, Any]] | pathlib.Path) -> None:
        if isinstance(manifest, pathlib.Path):
            self.kubectl("apply", "-f", str(manifest))
        else:
            items = list(manifest) if isinstance(manifest, Sequence) else [manifest]
            self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def helm(self, namespace: str = NAMESPACE) -> helm.Config:
        return helm.Config(kubeconfig_path=self.kubeconfig, namespace=namespace)

    def operator_pods(self) -> list[dict[str, Any]]:
        pods = self.json("-n", NAMESPACE, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        return [pod for pod in pods if pod["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                != "cleanup" and "job-name" not in pod["metadata"].get("labels", {})]


def eventually(check: Callable[[], Any], *, timeout: float = 90, interval: float = 1, what: str = "") -> Any:
    """``check()``'s first truthy result, retried until ``timeout``; else AssertionError with the last."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        try:
            last = check()
            if last:
                return last
        except AssertionError as error:
            last = error
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what or check.__name__}; last: {last}")
        time.sleep(interval)


def ready(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


