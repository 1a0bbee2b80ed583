"""A steady stream of admission requests through the API server, and what came back."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from typing import Any

import pykube
import requests

# A policy judging the stream: ConfigMaps named "...-bad" are denied, the others admitted.
POLICY_NAME = "node-stream"


def stream_policy(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy",
            "metadata": {"name": POLICY_NAME},
            "spec": {"match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                                              "operations": ["CREATE"]}],
                               "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
                     "validations": [{"expression": "!object.metadata.name.endsWith('-bad')",
                                      "message": "no bad ConfigMaps"}]}}


@dataclasses.dataclass
class Tally:
    """Answers as the policy says (allowed good, denied bad), and everything else, kept whole."""
    right: int = 0
    wrong: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        kinds = Counter(message[:80] for message in self.wrong)
        return f"{self.right} right, {len(self.wrong)} not: {dict(kinds)}"


class Admissions:
    """``clients`` threads sending dry-run ConfigMap creates in ``namespace`` until stopped."""

    def __init__(self, kubeconfig: str, namespace: str, clients: int = 2) -> None:
        self.kubeconfig, self.namespace, self.clients = kubeconfig, namespace, clients
        self.tally = Tally()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(clients)]

    def __enter__(self) -> Admissions:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, client: int) -> None:
        api = pykube.HTTPClient(pykube.KubeConfig.from_file(self.kubeconfig), timeout=30)
        sequence = 0
        while not self._stop.is_set():
            sequence += 1
            bad = sequence % 2 == 0
            name = f"s-{client}-{sequence}" + ("-bad" if bad else "")
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": self.namespace}}
            try:
                answer = api.post(url="configmaps", namespace=self.namespace, json=body, params={"dryRun": "All"})
                outcome = (answer.status_code, answer.json().get("message", ""))
            except requests.RequestException as exc:
                outcome = (0, f"no answer: {exc!r}")
            right = outcome[0] == 201 if not bad else outcome[0] == 403 and "no bad ConfigMaps" in outcome[1]
            with self._lock:
                if right:
                    self.tally.right += 1
                else:
                    self.tally.wrong.append(f"{outcome[0]} {outcome[1]}")
            time.sleep(0.02)
