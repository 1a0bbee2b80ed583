"""Rendering the Helm chart as `helm template` would, shared by tests/chart and tests/e2e.

The chart tests check the rendered objects offline; the e2e tests hand the very same objects to a
real API server (`kubectl apply --dry-run=server`, and the operator's RBAC for real). One renderer
keeps the two from drifting apart. A plain module (no package), imported like tests/e2e/e2e_kube.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "admission-policy-operator"
RELEASE = "apo"
NAMESPACE = "policy-system"

# Values the chart is checked with: name -> (values, namespace).
SCENARIOS: dict[str, tuple[dict[str, Any], str]] = {
    "defaults": ({}, NAMESPACE),
    "one-replica": ({"replicaCount": 1}, NAMESPACE),
    "custom-exempt": ({"exemptNamespaces": ["kube-system", "cert-manager", "monitoring"]}, NAMESPACE),
    "metrics-off": ({"metrics": {"enabled": False}}, NAMESPACE),
    "custom-namespace": ({}, "platform-guardrails"),
    "everything": (
        {
            "replicaCount": 3,
            "logLevel": "DEBUG",
            "featureGates": {"TLSSecretsPlugin": False, "ImageReferencesPlugin": True},
            "defaultFailurePolicy": "Ignore",
            "webhookTimeoutSeconds": 10,
            "webhook": {"port": 10443, "configName": "guardrails", "certSecretName": "guardrails-tls"},
            "metrics": {"enabled": True, "port": 9090, "service": {"port": 80}},
            "health": {"port": 9091},
            "peering": {"name": "guardrails"},
            "image": {"repository": "registry.example.com/apo", "digest": "sha256:" + "ab" * 32},
            "imagePullSecrets": [{"name": "regcred"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
            "podAntiAffinity": "hard",
            "priorityClassName": "system-cluster-critical",
            "rbac": {"extraRules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
                     "contextResources": [{"apiGroups": [""], "resources": ["limitranges"]}]},
            "podDisruptionBudget": {"minAvailable": 2},
            "networkPolicy": {
                "webhookFrom": [{"ipBlock": {"cidr": "172.18.0.0/16", "except": ["172.18.0.128/25"]}},
                                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                 "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}}],
                "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            },
        },
        NAMESPACE,
    ),
}


def render(chart: helm.Chart, values: dict[str, Any] | None = None, namespace: str = NAMESPACE,
           release: str = RELEASE) -> list[dict[str, Any]]:
    """All objects the chart renders (templates and hooks; the CRDs come from `chart.crds`)."""
    rendered = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def crd_documents(chart: helm.Chart) -> dict[str, dict[str, Any]]:
    """The chart's CRDs (its crds/ directory, which Helm installs before the templates), by name."""
    crds: dict[str, dict[str, Any]] = {}
    for entry in chart.crds:
        for doc in yaml.safe_load_all(entry["data"]):
            if doc:
                crds[doc["metadata"]["name"]] = doc
    return crds
