"""Does bench/pss-vap.yaml decide like the Pod Security examples? A check, not a benchmark.

    KUBEBUILDER_ASSETS=... python bench/vap_check.py

The e2e bench compares the operator's cost with a ValidatingAdmissionPolicy's, which only means
something if both enforce the same rules. This starts an envtest control plane (the VAP served
as its version needs), loads the VAP, and dry-run creates every object of the CREATE cases in
examples/pod-security-{baseline,restricted}/test.yaml (Pods, and Deployments: what the VAP
covers), then prints each case where the VAP's answer differs from the one the examples expect
of the operator. Objects the API server itself refuses (e.g. a Pod created with ephemeral
containers, which only the subresource may add) are listed apart.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile
from typing import Any

import yaml

import vap
from common import EXAMPLES
from e2e_cluster import Api, ControlPlane, ControlPlaneError, SetupError

NAMESPACE = "vap-check"
COLLECTIONS = {"Pod": f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All",
               "Deployment": f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments?dryRun=All"}


def cases() -> list[tuple[str, pathlib.Path, bool]]:
    """(case name, object file, allowed?) of every CREATE case with one object. The VAP holds
    baseline and restricted together, as the restricted suite loads them; the baseline suite
    loads baseline alone, so only its denials say what the pair must do."""
    found = []
    for example in ("pod-security-baseline", "pod-security-restricted"):
        suite = yaml.safe_load((EXAMPLES / example / "test.yaml").read_text())
        for case in suite["cases"]:
            expect = case.get("expect", {})
            if case.get("operation", "CREATE") == "CREATE" and isinstance(case.get("object"), str) \
                    and "oldObject" not in case and "allowed" in expect \
                    and (example == "pod-security-restricted" or not expect["allowed"]):
                found.append((f"{example}: {case['name']}", EXAMPLES / example / case["object"],
                              bool(case["expect"]["allowed"])))
    return found


def decide(api: Api, body: dict[str, Any]) -> str:
    body = {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}}
    status, answer = api.call("POST", COLLECTIONS[body["kind"]], body)
    if 200 <= status < 300:
        return "allowed"
    message = answer.get("message", "") if isinstance(answer, dict) else str(answer)
    return "denied" if "ValidatingAdmissionPolicy" in message else f"refused by the API server: {message[:160]}"


def main() -> None:
    assets = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
    if not assets:
        sys.exit("error: set KUBEBUILDER_ASSETS (see tests/e2e/README.md)")
    with tempfile.TemporaryDirectory(prefix="ap-vap-check-") as workdir:
        try:
            plane = ControlPlane(pathlib.Path(assets), workdir=pathlib.Path(workdir))
        except ControlPlaneError as exc:
            sys.exit(f"error: {exc}")
        try:
            plane.start()
            api = Api(plane.kubeconfig)
            api.ensure_namespace(NAMESPACE)
            for path, body in vap.objects(plane.version):
                api.create(path, body)
            api.wait("the VAP to deny", lambda: decide(api, yaml.safe_load(
                (EXAMPLES / "pod-security-baseline" / "pods" / "privileged.yaml").read_text())) == "denied")
            checked, differ, refused = 0, [], []
            for name, path, allowed in cases():
                body = yaml.safe_load(path.read_text())
                if body.get("kind") not in COLLECTIONS:
                    continue
                got = decide(api, body)
                checked += 1
                if got.startswith("refused"):
                    refused.append(f"{name}: {got}")
                elif (got == "allowed") != allowed:
                    differ.append(f"{name}: expected {'allowed' if allowed else 'denied'}, the VAP {got}")
        except (ControlPlaneError, SetupError) as exc:
            sys.exit(f"error: {exc}")
        finally:
            plane.stop()
    print(f"{checked} cases; the VAP decides {checked - len(differ) - len(refused)} like the examples expect")
    for line in differ:
        print("   DIFFERS  " + line)
    for line in refused:
        print("   SKIPPED  " + line)


if __name__ == "__main__":
    main()
