"""The offline CLI: suites, ad-hoc objects, review responses, and clear errors with exit code 2."""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from admission_policy.cli import main

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
OFFENSIVE = EXAMPLES / "deny-offensive-pod-names"


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_every_example_suite_passes() -> None:
    code, out, err = run("test", str(EXAMPLES))
    assert code == 0, out + err
    assert "FAIL" not in out
    suites = sorted(p.parent.name for p in EXAMPLES.glob("*/test.yaml"))
    assert len(suites) >= 12
    for name in suites:
        assert f"{name}/test.yaml" in out


def test_the_console_script_runs_the_examples() -> None:
    script = shutil.which("admission-policy", path=str(Path(sys.executable).parent))
    assert script, "the console script is installed with the package"
    done = subprocess.run([script, "test", str(OFFENSIVE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout


def test_a_wrong_expectation_exits_1_naming_the_case(tmp_path: Path) -> None:
    copy = tmp_path / "example"
    shutil.copytree(OFFENSIVE, copy)
    suite = yaml.safe_load((copy / "test.yaml").read_text())
    case = next(c for c in suite["cases"] if c["expect"]["allowed"] is False)
    case["expect"]["allowed"] = True
    (copy / "test.yaml").write_text(yaml.safe_dump(suite))
    code, out, _ = run("test", str(copy))
    assert code == 1
    assert f"FAIL  {case['name']}" in out
    assert "expected allowed, got denied" in out


def test_objects_are_evaluated_against_policies_with_a_report() -> None:
    code, out, _ = run("test", "-p", str(OFFENSIVE / "policy.yaml"), str(OFFENSIVE / "pod-offensive.yaml"))
    assert code == 0
    assert "DENIED (403 Forbidden)" in out


def test_mutation_is_shown_as_a_yaml_diff_and_json_output(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy", "metadata": {"name": "team"},
        "spec": {"match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                          "operations": ["CREATE"]}]},
                 "mutations": [{"merge": {"metadata": {"labels": {"team": "unassigned"}}}}]}}))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                                   "spec": {"containers": [{"name": "c", "image": "nginx"}]}}))
    code, out, _ = run("test", "-p", str(policy), str(pod))
    assert code == 0 and "team (Enforce): mutated" in out
    assert "+    team: unassigned" in out
    code, out, _ = run("test", "-p", str(policy), str(pod), "-o", "json")
    report = json.loads(out)
    assert report["inputs"][0]["patch"] == [{"op": "add", "path": "/metadata/labels",
                                             "value": {"team": "unassigned"}}]


def review_request(name: str) -> dict[str, object]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": "CREATE", "namespace": "default", "name": name,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": {"username": "alice"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}


def test_review_prints_the_webhook_response() -> None:
    code, out, _ = run("review", "-p", str(OFFENSIVE / "policy.yaml"), "-",
                       stdin=json.dumps(review_request("offensive-pod")))
    assert code == 0
    response = json.loads(out)
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["response"]["allowed"] is False
    assert response["response"]["status"]["code"] == 403
    code, out, _ = run("review", "-p", str(OFFENSIVE / "policy.yaml"), "-",
                       stdin=yaml.safe_dump(review_request("friendly")))
    assert code == 0 and json.loads(out)["response"]["allowed"] is True


def test_review_patch_decodes_to_the_mutation() -> None:
    lifespan = EXAMPLES / "lifespan-toleration"
    request = review_request("web")
    request["request"]["object"]["metadata"]["labels"] = {"acme.com/lifespan-requested": "3"}  # type: ignore[index]
    code, out, _ = run("review", "-p", str(lifespan / "policy.yaml"), "-", stdin=json.dumps(request))
    assert code == 0
    patch = json.loads(base64.b64decode(json.loads(out)["response"]["patch"]))
    assert {"key": "acme.com/lifespan-remaining", "operator": "Equal", "value": "14",
            "effect": "NoSchedule"} in [op["value"] if isinstance(op["value"], dict) else op["value"][0]
                                        for op in patch]


@pytest.mark.parametrize(("content", "words"), [
    ("kind: AdmissionReview\nrequest: {uid: x}\n", "request.operation is required"),
    ("{not json", "not valid YAML or JSON"),
    ("kind: Pod\n", "kind must be 'AdmissionReview'"),
])
def test_review_rejects_unusable_input_with_one_line(tmp_path: Path, content: str, words: str) -> None:
    review = tmp_path / "review.json"
    review.write_text(content)
    code, out, err = run("review", "-p", str(OFFENSIVE / "policy.yaml"), str(review))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {review}") and words in err
    assert len(err.strip().splitlines()) == 1


def test_invalid_policy_file_points_at_file_path_and_column(tmp_path: Path) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy", "metadata": {"name": "bad"},
        "spec": {"match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                          "operations": ["CREATE"]}]},
                 "validations": [{"expression": "object.metadata.name.startsWith("}]}}))
    code, _, err = run("test", "-p", str(policy), str(OFFENSIVE / "policy.yaml"))
    assert code == 2
    assert f"{policy}: AdmissionPolicy 'bad': spec.validations[0].expression (line 1, column 33)" in err


def test_missing_file_is_a_clear_error() -> None:
    code, _, err = run("test", "/nonexistent/suite.yaml")
    assert code == 2 and "error: /nonexistent/suite.yaml: no such file or directory" in err


def test_help_explains_itself() -> None:
    code, out, _ = run("--help")
    assert code == 0 and "admission-policy test examples/" in out
    code, out, _ = run("test", "--help")
    assert code == 0 and "AdmissionPolicyTest" in out
