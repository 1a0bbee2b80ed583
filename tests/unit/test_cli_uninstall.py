"""The uninstall cleanup of the generated ValidatingAdmissionPolicies (``cli/uninstall.py``) against
a fake API: what it deletes, in which order, on which version, and what it says when it cannot.
tests/e2e/test_e2e_uninstall.py runs it against a real API server with the chart's RBAC."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from kubernetes_asyncio.config import kube_config

from admission_policy.cli import main
from admission_policy.cli.uninstall import remove_generated
from admission_policy.vap.native import FINALIZER, MANAGED_BY

GROUP = "admissionregistration.k8s.io"
POLICIES, BINDINGS = "validatingadmissionpolicies", "validatingadmissionpolicybindings"
OTHER_FINALIZER = "example.com/keep"


class FakeAPI:
    """Serves discovery, labelled/field-selected lists, merge patches (resourceVersion checked) and
    deletes (finalizers honoured) of the two kinds, on the versions in ``served``."""

    def __init__(self, served: tuple[str, ...] = ("v1", "v1beta1")) -> None:
        self.served = served
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}   # answered instead, once
        self.before_patch: dict[str, Any] = {}                      # name -> callable, run once
        self.version = 0

    def add(self, plural: str, name: str, *, labelled: bool = True, finalizers: tuple[str, ...] = (FINALIZER,),
            terminating: bool = False) -> None:
        metadata: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY) if labelled else {"team": "a"},
                                    "finalizers": list(finalizers), "resourceVersion": self._next()}
        if terminating:
            metadata["deletionTimestamp"] = "2024-01-01T00:00:00Z"
        self.objects[plural, name] = {"metadata": metadata}

    def names(self, plural: str) -> set[str]:
        return {name for (p, name) in self.objects if p == plural}

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    async def __call__(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                       body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        self.calls.append((method, path))
        if (method, path) in self.answers:
            return self.answers.pop((method, path))
        parts = path.strip("/").split("/")
        assert parts[:2] == ["apis", GROUP], path
        version = parts[2]
        if len(parts) == 3:
            if version not in self.served:
                return 404, {"kind": "Status", "message": "the server could not find the requested resource"}
            resources = (POLICIES, BINDINGS, "validatingwebhookconfigurations")
            return 200, {"resources": [{"name": resource} for resource in resources]}
        assert version in self.served, f"{method} {path}: a version not served"
        plural, name = parts[3], (parts[4] if len(parts) > 4 else None)
        if name is None:
            assert method == "GET"
            selectors = dict(query or [])
            wanted = dict(pair.split("=") for pair in selectors["labelSelector"].split(","))
            field = selectors.get("fieldSelector", "").removeprefix("metadata.name=")
            items = [copy.deepcopy(obj) for (p, n), obj in sorted(self.objects.items()) if p == plural
                     and wanted.items() <= obj["metadata"]["labels"].items() and (not field or n == field)]
            return 200, {"items": items}
        obj = self.objects.get((plural, name))
        if obj is None:
            return 404, {"kind": "Status", "message": f"{plural} {name!r} not found"}
        metadata = obj["metadata"]
        if method == "PATCH":
            assert content_type == "application/merge-patch+json"
            if name in self.before_patch:
                self.before_patch.pop(name)(metadata)
            if body["metadata"].get("resourceVersion") not in (None, metadata["resourceVersion"]):
                return 409, {"kind": "Status", "message": "the object has been modified"}
            metadata["finalizers"] = body["metadata"]["finalizers"] or []
            metadata["resourceVersion"] = self._next()
            if "deletionTimestamp" in metadata and not metadata["finalizers"]:
                del self.objects[plural, name]
            return 200, copy.deepcopy(obj)
        assert method == "DELETE", method
        if metadata["finalizers"]:
            metadata.setdefault("deletionTimestamp", "2024-01-01T00:00:00Z")
            return 200, copy.deepcopy(obj)
        del self.objects[plural, name]
        return 200, copy.deepcopy(obj)


def generated_pairs(api: FakeAPI, *names: str) -> None:
    for name in names:
        api.add(POLICIES, name)
        api.add(BINDINGS, name)


async def test_bindings_go_before_policies_each_released_then_deleted() -> None:
    api = FakeAPI()
    generated_pairs(api, "ap.policy.a", "ap.policy.b")
    api.add(POLICIES, "someone-elses", labelled=False)
    api.add(BINDINGS, "someone-elses", labelled=False)

    removal = await remove_generated(api)

    assert removal.version == "v1" and removal.failed == [] and removal.terminating == []
    assert removal.deleted == [f"{kind} ap.policy.{name}" for kind in ("ValidatingAdmissionPolicyBinding",
                                                                       "ValidatingAdmissionPolicy") for name in "ab"]
    assert api.names(POLICIES) == api.names(BINDINGS) == {"someone-elses"}
    writes = [(method, path.rsplit("/", 2)[-2:]) for method, path in api.calls if method != "GET"]
    assert writes == [(method, [plural, name]) for plural in (BINDINGS, POLICIES)
                      for name in ("ap.policy.a", "ap.policy.b") for method in ("PATCH", "DELETE")]


async def test_the_version_served_is_the_one_used() -> None:
    api = FakeAPI(served=("v1beta1",))
    generated_pairs(api, "ap.policy.a")
    removal = await remove_generated(api)
    assert removal.version == "v1beta1" and len(removal.deleted) == 2 and not api.objects
    assert all(f"/{GROUP}/v1beta1/" in path for _, path in api.calls if path.count("/") > 3)   # past discovery


async def test_no_validating_admission_policy_api_is_nothing_to_do() -> None:
    api = FakeAPI(served=())
    removal = await remove_generated(api)
    assert (removal.version, removal.deleted, removal.failed) == (None, [], [])
    assert api.calls == [("GET", f"/apis/{GROUP}/v1"), ("GET", f"/apis/{GROUP}/v1beta1")]


async def test_an_api_server_out_of_reach_is_an_error_not_an_api_not_served() -> None:
    api = FakeAPI()
    api.answers["GET", f"/apis/{GROUP}/v1"] = (503, {"message": "cannot reach the API server: refused"})
    with pytest.raises(RuntimeError, match=rf"discovery of {GROUP}/v1 failed \(503\): cannot reach"):
        await remove_generated(api)


async def test_what_cannot_be_deleted_is_named_and_the_rest_still_goes() -> None:
    api = FakeAPI()
    generated_pairs(api, "ap.policy.a", "ap.policy.b")
    api.answers["DELETE", f"/apis/{GROUP}/v1/{BINDINGS}/ap.policy.a"] = (403, {"message": "forbidden: no delete"})
    api.answers["GET", f"/apis/{GROUP}/v1/{POLICIES}"] = (403, {"message": "forbidden: no list"})
    removal = await remove_generated(api)
    assert removal.failed == [
        "ValidatingAdmissionPolicyBinding ap.policy.a: deleting failed (403): forbidden: no delete",
        "validatingadmissionpolicies: listing failed (403): forbidden: no list"]
    assert removal.deleted == ["ValidatingAdmissionPolicyBinding ap.policy.b"]
    assert api.names(BINDINGS) == {"ap.policy.a"}


async def test_a_change_meanwhile_is_read_again_and_another_finalizer_is_kept() -> None:
    api = FakeAPI()
    api.add(POLICIES, "ap.policy.a")

    def someone_adds_a_finalizer(metadata: dict[str, Any]) -> None:
        metadata["finalizers"].append(OTHER_FINALIZER)
        metadata["resourceVersion"] = api._next()

    api.before_patch["ap.policy.a"] = someone_adds_a_finalizer
    removal = await remove_generated(api)
    assert removal.failed == [] and removal.deleted == []
    assert removal.terminating == [f"ValidatingAdmissionPolicy ap.policy.a (finalizers: {OTHER_FINALIZER})"]
    metadata = api.objects[POLICIES, "ap.policy.a"]["metadata"]
    assert metadata["finalizers"] == [OTHER_FINALIZER] and "deletionTimestamp" in metadata
    assert [m for m, _ in api.calls].count("PATCH") == 2


async def test_one_terminating_already_goes_once_released() -> None:
    api = FakeAPI()
    api.add(BINDINGS, "ap.policy.a", terminating=True)
    removal = await remove_generated(api)
    assert removal.deleted == ["ValidatingAdmissionPolicyBinding ap.policy.a"] and not api.objects


def test_cleanup_names_everything_it_could_not_delete_on_one_line(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # A kubeconfig whose API server refuses connections (the client reads $KUBECONFIG when imported).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    result = CliRunner().invoke(main, ["cleanup", "--name", "release-x"], env={
        "KUBERNETES_SERVICE_HOST": None, "AP_WEBHOOK_CONFIG_NAME": None})
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: cannot delete the webhook configurations 'release-x' (")
    assert f"; the generated ValidatingAdmissionPolicies (discovery of {GROUP}/v1 failed (503)" in line
