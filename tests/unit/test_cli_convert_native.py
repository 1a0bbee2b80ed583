"""``admission-policy convert --to-native``: AdmissionPolicies in, the ValidatingAdmissionPolicies
and bindings the operator would generate out (less its finalizer and generation annotation); what
does not port is one line per obstacle on standard error, and exit code 2."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from admission_policy.cli import main
from admission_policy.cluster.routing import ServedIndex, break_glass_condition
from admission_policy.config import OperatorConfig
from admission_policy.engine import load_policy
from admission_policy.vap import native
from builders import policy_body, rule

ROOT = Path(__file__).parents[2]
OFFENSIVE = "examples/deny-offensive-pod-names/policy.yaml"
TENANT = "examples/tenant-policy/policy.yaml"
NAME_LABEL = "kubernetes.io/metadata.name"


def run(*args: str, stdin: str | None = None) -> tuple[int, list[dict[str, Any]], list[str]]:
    """Exit code, the objects written, the lines on standard error."""
    result = CliRunner().invoke(main, ["convert", "--to-native", *args], input=stdin)
    assert "Traceback" not in result.output + result.stderr
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, [body for body in yaml.safe_load_all(result.stdout) if body], result.stderr.splitlines()


def write(tmp_path: Path, *bodies: dict[str, Any], name: str = "policies.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(bodies))
    return str(path)


def vaps(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "ValidatingAdmissionPolicy"}


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)   # the examples by the paths the docs use


def test_the_objects_are_the_operators_with_its_defaults_less_what_only_it_keeps_true() -> None:
    code, objects, errors = run(OFFENSIVE)
    assert (code, errors) == (0, [])
    body = yaml.safe_load((ROOT / OFFENSIVE).read_text())
    defaults = OperatorConfig()
    operator = native.plan(load_policy(body, "Fail"), body, native.Target(
        "v1", (1, 32), ServedIndex(()), defaults.all_exempt_namespaces,
        break_glass_condition(defaults.break_glass_users, defaults.break_glass_groups)))
    assert len(operator.objects) == 6
    expected = []
    for obj in operator.objects:
        labels = {key: value for key, value in obj["metadata"]["labels"].items() if key not in native.MANAGED_BY}
        expected.append({**obj, "metadata": {"name": obj["metadata"]["name"], "labels": labels}})
    assert objects == expected
    assert all(set(obj["metadata"]) == {"name", "labels"} for obj in objects)
    policy = vaps(objects)["ap.policy.deny-offensive-pod-names"]["spec"]
    assert policy["matchConstraints"]["namespaceSelector"] == {"matchExpressions": [
        {"key": NAME_LABEL, "operator": "NotIn", "values": ["admission-policy-system", "kube-system"]}]}
    assert [c["name"] for c in policy["matchConditions"]] == ["not-break-glass", "any-validation-fails"]


def test_optional_syntax_is_written_without_optionals_for_1_28() -> None:
    code, objects, errors = run("--kubernetes", "1.28", OFFENSIVE)
    assert (code, errors, len(objects)) == (0, [], 6)
    expressions = [v["expression"] for obj in objects if obj["kind"] == "ValidatingAdmissionPolicy"
                   for v in obj["spec"]["validations"]]
    assert expressions and not any(".?" in text or "[?" in text for text in expressions)
    code, objects, errors = run("--kubernetes", "1.29", OFFENSIVE)
    assert (code, errors, len(objects)) == (0, [], 6)


@pytest.mark.parametrize(("kubernetes", "version"), [("1.28", "v1beta1"), ("1.29", "v1beta1"), ("1.30", "v1"),
                                                     ("v1.31.4", "v1"), ("1.33", "v1")])
def test_the_api_version_is_the_one_that_kubernetes_serves(tmp_path: Path, kubernetes: str, version: str) -> None:
    path = write(tmp_path, policy_body(rules=[rule("configmaps")], validations=[{"expression": "true"}]))
    code, objects, errors = run("--kubernetes", kubernetes, path)
    assert (code, errors) == (0, [])
    assert [obj["apiVersion"] for obj in objects] == [f"admissionregistration.k8s.io/{version}"] * 2


def test_a_library_of_a_later_kubernetes_ports_only_there(tmp_path: Path) -> None:
    path = write(tmp_path, policy_body("semantic", rules=[rule("configmaps")],
                                       validations=[{"expression": "semver('1.2.3').major() == 1"}]))
    code, objects, errors = run(path)   # the default: 1.32
    assert (code, objects) == (2, [])
    assert errors == [f"not portable  {path}: AdmissionPolicy 'semantic': spec.validations[0].expression: needs "
                      "Kubernetes 1.33 or later (library semver); this cluster is 1.32"]
    assert run("--kubernetes", "1.33", path)[0] == 0


def test_what_ports_is_written_and_what_does_not_is_said(tmp_path: Path) -> None:
    path = write(tmp_path,
                 policy_body("fine", rules=[rule("configmaps")], validations=[{"expression": "true"}]),
                 policy_body("mutating", rules=[rule("configmaps")], mutations=[
                     {"jsonPatch": [{"op": "add", "path": "/metadata/labels/x", "value": "y"}]}]))
    code, objects, errors = run(path)
    assert code == 2
    assert [obj["metadata"]["name"] for obj in objects] == ["ap.policy.fine", "ap.policy.fine"]
    assert errors == [f"not portable  {path}#2: AdmissionPolicy 'mutating': spec.mutations: the API server serves "
                      "no MutatingAdmissionPolicy (admissionregistration.k8s.io v1alpha1 from Kubernetes 1.32, "
                      "behind its feature gate)"]
    # ... unless the cluster serves it: then it is a MutatingAdmissionPolicy and binding.
    code, objects, errors = run("--mutating-api", "v1alpha1", path)
    assert (code, errors) == (0, [])
    assert [(obj["kind"], obj["metadata"]["name"]) for obj in objects][2:] == [
        ("MutatingAdmissionPolicy", "ap.policy.mutating"), ("MutatingAdmissionPolicyBinding", "ap.policy.mutating")]


def test_a_tenant_policy_keeps_to_its_namespace() -> None:
    code, objects, errors = run("--exempt-namespace", "kube-system", TENANT)
    assert (code, errors) == (0, [])
    assert sorted(vaps(objects)) == ["nap.team-a.podtemplate.require-team-label",
                                     "nap.team-a.policy.require-team-label"]
    for obj in vaps(objects).values():
        assert obj["metadata"]["labels"]["policy-operator.dev/policy-namespace"] == "team-a"
        assert obj["spec"]["matchConstraints"]["namespaceSelector"] == {"matchExpressions": [
            {"key": NAME_LABEL, "operator": "In", "values": ["team-a"]},
            {"key": NAME_LABEL, "operator": "NotIn", "values": ["kube-system"]}]}


def test_exempt_namespaces_and_break_glass_replace_the_operators_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, policy_body(rules=[rule("configmaps")], validations=[{"expression": "true"}]))
    code, objects, _ = run("--exempt-namespace", "ops,tools", "--exempt-namespace", "kube-system",
                           "--break-glass-user", "alice", "--break-glass-group", "", path)
    assert code == 0
    spec = vaps(objects)["ap.policy.p"]["spec"]
    assert spec["matchConstraints"]["namespaceSelector"]["matchExpressions"] == [
        {"key": NAME_LABEL, "operator": "NotIn", "values": ["kube-system", "ops", "tools"]}]
    assert spec["matchConditions"][:-1] == [break_glass_condition(["alice"], [])]
    code, objects, _ = run("--exempt-namespace", "", "--break-glass-group", "", path)
    spec = vaps(objects)["ap.policy.p"]["spec"]
    assert (code, spec["matchConstraints"]["namespaceSelector"]) == (0, {})
    assert [c["name"] for c in spec["matchConditions"]] == ["any-validation-fails"]


def test_a_wildcard_needs_the_clusters_discovery(tmp_path: Path) -> None:
    path = write(tmp_path, policy_body("everything", rules=[
        rule("configmaps"), {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["*"], "operations": ["*"]}],
        validations=[{"expression": "true"}]))
    code, objects, errors = run(path)
    assert (code, objects) == (2, [])
    assert errors == [f"not portable  {path}: AdmissionPolicy 'everything': spec.match.resources[1]: \"*\" in "
                      "apiGroups or resources is expanded from the cluster's discovery, which is not at hand offline: "
                      "name the groups and resources, or let the operator generate the objects"]


def test_a_policy_that_does_not_compile_is_an_error_and_the_others_are_written(tmp_path: Path) -> None:
    path = write(tmp_path, policy_body("broken", validations=[{"expression": "object.("}]),
                 policy_body("fine", rules=[rule("configmaps")], validations=[{"expression": "true"}]),
                 policy_body("fine", rules=[rule("secrets")], validations=[{"expression": "true"}]))
    code, objects, errors = run(path)
    assert code == 2
    assert {obj["metadata"]["name"] for obj in objects} == {"ap.policy.fine"}
    assert errors[0].startswith(f"error: {path}#1: AdmissionPolicy 'broken': spec.validations[0].expression (line 1")
    assert errors[-1] == f"error: {path}#3: AdmissionPolicy 'fine' is also defined in {path}#2"


def test_standard_input_and_an_output_file(tmp_path: Path) -> None:
    output = tmp_path / "native.yaml"
    code, objects, errors = run("-o", str(output), "-", stdin=(ROOT / OFFENSIVE).read_text())
    assert (code, objects, errors) == (0, [], [])
    assert run(OFFENSIVE)[1] == list(yaml.safe_load_all(output.read_text()))


@pytest.mark.parametrize(("args", "message"), [
    (["--kubernetes", "1.27", OFFENSIVE], "error: --kubernetes 1.27: ValidatingAdmissionPolicy is served from "
                                          "Kubernetes 1.28 (v1beta1, behind its feature gate) and 1.30 (v1)"),
    (["--kubernetes", "latest", OFFENSIVE], "error: --kubernetes 'latest': expected a version such as 1.32"),
    (["--exempt-namespace", "Not_A_Name", OFFENSIVE],
     "error: --exempt-namespace='Not_A_Name': 'Not_A_Name' is not a valid namespace name"),
    (["examples/no-such-dir"], "error: examples/no-such-dir: no such file or directory"),
    (["examples/from-vap/vap.yaml"], "error: nothing converted: no AdmissionPolicy or NamespacedAdmissionPolicy in "
                                     "examples/from-vap/vap.yaml"),
])
def test_unusable_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    assert run(*args) == (2, [], [message])


def test_the_native_options_need_to_native() -> None:
    result = CliRunner().invoke(main, ["convert", "--kubernetes", "1.30", "examples/from-vap/vap.yaml"])
    assert result.exit_code == 2
    assert "--kubernetes: only with --to-native" in result.stderr
