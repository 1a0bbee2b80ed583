"""The offline CLI: suites, ad-hoc objects, review responses, and clear errors with exit code 2."""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from admission_policy.command import main
from builders import CREATE_POD_RULE, pod, policy_body, review

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
    policy.write_text(yaml.safe_dump(policy_body("team", rules=[CREATE_POD_RULE], mutations=[
        {"merge": {"metadata": {"labels": {"team": "unassigned"}}}}])))
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


UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def review_request(name: str) -> dict[str, Any]:
    """What the API server sends to create Pod default/<name>."""
    return review(pod(name), kind="Pod", name=name, uid=UID, user_info={"username": "alice"})


def test_review_prints_the_webhook_response() -> None:
    code, out, _ = run("review", "-p", str(OFFENSIVE / "policy.yaml"), "-",
                       stdin=json.dumps(review_request("offensive-pod")))
    assert code == 0
    response = json.loads(out)
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == UID
    assert response["response"]["allowed"] is False
    assert response["response"]["status"]["code"] == 403
    code, out, _ = run("review", "-p", str(OFFENSIVE / "policy.yaml"), "-",
                       stdin=yaml.safe_dump(review_request("friendly")))
    assert code == 0 and json.loads(out)["response"]["allowed"] is True


def test_review_patch_decodes_to_the_mutation() -> None:
    lifespan = EXAMPLES / "lifespan-toleration"
    request = review_request("web")
    request["request"]["object"]["metadata"]["labels"] = {"acme.com/lifespan-requested": "3"}
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
    policy.write_text(yaml.safe_dump(policy_body("bad", rules=[CREATE_POD_RULE], validations=[
        {"expression": "object.metadata.name.startsWith("}])))
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


def write_policy(path: Path, name: str, **spec: object) -> Path:
    path.write_text(yaml.safe_dump(policy_body(name, rules=[CREATE_POD_RULE], **spec)))
    return path


def test_a_generate_name_gets_its_name_between_mutation_and_validation(tmp_path: Path) -> None:
    # As the API server: mutating webhooks see no name, validating ones the generated name, in the
    # object and in request.name; the patch holds only what the mutations did.
    policies = tmp_path / "policies"
    policies.mkdir()
    seen = "{'seen': object.metadata.?name.orValue('none')}"
    write_policy(policies / "label.yaml", "label", mutations=[{"jsonPatch": [
        {"op": "add", "path": "/metadata/labels", "valueExpression": seen}]}])
    write_policy(policies / "name.yaml", "name", validations=[
        {"expression": "object.metadata.name.startsWith('web-') && request.name == object.metadata.name",
         "messageExpression": "'got ' + object.metadata.name"}])
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-"},
                                   "spec": {"containers": [{"name": "c", "image": "nginx"}]}}))
    code, out, err = run("test", "-p", str(policies), str(pod))
    assert code == 0, out + err
    generated = re.search(r"pods default/(web-[bcdfghjklmnpqrstvwxz2456789]{5}), CREATE\): ALLOWED", out)
    assert generated, out
    assert f"metadata.name {generated[1]!r} generated from generateName" in out
    assert "+    seen: none" in out
    assert run("test", "-p", str(policies), str(pod))[1] == out    # the same name every run
    code, out, _ = run("test", "-p", str(policies), str(pod), "-o", "json")
    report = json.loads(out)["inputs"][0]
    assert report["generatedName"] == generated[1]
    assert report["patch"] == [{"op": "add", "path": "/metadata/labels", "value": {"seen": "none"}}]


def test_the_generated_name_is_reported_in_suites() -> None:
    code, out, _ = run("test", str(OFFENSIVE))
    assert code == 0
    assert re.search(r"metadata.name 'offensive-worker-[a-z0-9]{5}' generated from generateName", out), out


def test_a_policy_passed_as_an_object_says_to_pass_it_with_p() -> None:
    policy = str(OFFENSIVE / "policy.yaml")
    code, out, err = run("test", policy)
    assert code == 2 and out == ""
    assert f"error: {policy}: an AdmissionPolicy is not an object to test: pass policies with -p" in err
    code, _, err = run("test", "-p", str(EXAMPLES / "lifespan-toleration"), policy, str(OFFENSIVE / "pod-nice.yaml"))
    assert code == 2 and "pass policies with -p" in err
    # The same file as a policy and as a path is fine: its other documents are the objects.
    code, out, _ = run("test", "-p", policy, policy, str(OFFENSIVE / "pod-nice.yaml"))
    assert code == 0 and "ALLOWED" in out


@pytest.mark.parametrize("as_policy", [False, True])
def test_an_empty_file_says_it_is_empty(tmp_path: Path, as_policy: bool) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    args = ["-p", str(empty), str(OFFENSIVE / "pod-nice.yaml")] if as_policy else [str(empty)]
    code, _, err = run("test", *args)
    assert code == 2
    assert err == f"error: {empty}: the file is empty (no YAML or JSON document in it)\n"


def test_a_case_naming_a_missing_file_fails_alone(tmp_path: Path) -> None:
    copy = tmp_path / "example"
    shutil.copytree(OFFENSIVE, copy)
    suite = yaml.safe_load((copy / "test.yaml").read_text())
    suite["cases"][1]["object"] = "pod-missing.yaml"
    (copy / "test.yaml").write_text(yaml.safe_dump(suite))
    code, out, err = run("test", str(copy))
    assert code == 1, out + err
    assert f"{copy / 'test.yaml'} (deny-offensive-pod-names)" in out
    assert f"FAIL  {suite['cases'][1]['name']}\n        cannot run: cases[1].object: {copy / 'pod-missing.yaml'}: " \
           "no such file" in out
    assert out.count("PASS") == len(suite["cases"]) - 1


def test_errors_are_json_under_o_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    write_policy(bad, "bad", validations=[{"expression": "object.metadata.name.startsWith("}])
    code, out, err = run("test", "-o", "json", "-p", str(bad), str(OFFENSIVE / "pod-nice.yaml"))
    assert code == 2 and err == ""
    [line] = json.loads(out)["errors"]
    assert line.startswith(f"{bad}: AdmissionPolicy 'bad': spec.validations[0].expression (line 1, column 33)")
    code, out, _ = run("test", "-o", "json", "/nonexistent/suite.yaml")
    assert code == 2 and json.loads(out) == {"errors": ["/nonexistent/suite.yaml: no such file or directory"]}


@pytest.mark.parametrize(("env", "name"), [({}, "admission-policy-operator"),
                                           ({"AP_WEBHOOK_CONFIG_NAME": "release-x"}, "release-x")])
def test_cleanup_webhooks_defaults_to_the_operators_name(tmp_path: Path, env: dict[str, str], name: str) -> None:
    # A kubeconfig whose API server refuses connections: the error names the configurations it tried.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}))
    result = CliRunner().invoke(main, ["cleanup-webhooks"], env={
        "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": None, "AP_WEBHOOK_CONFIG_NAME": None, **env})
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: cannot delete the webhook configurations {name!r}: ")
    code, out, _ = run("cleanup-webhooks", "--help")
    assert code == 0 and "app.kubernetes.io/managed-by=admission-policy-operator" in out


# The flags `run` took before they were generated from the settings (issue 25): scripts pass them.
RUN_FLAGS = ["--namespace", "--service-name", "--service-port", "--listen-host", "--listen-port", "--advertise-host",
             "--advertise-port", "--webhook-timeout", "--max-connections", "--exempt-namespaces",
             "--default-failure-policy", "--metrics-port", "--health-port", "--log-level", "--cert-secret",
             "--cert-dir", "--cert-lifetime", "--webhook-config-name", "--feature-gates", "--audit-interval",
             "--audit-page-size", "--audit-violations-limit", "--standalone"]


def test_every_documented_setting_is_a_run_flag_naming_its_variable() -> None:
    table = (ROOT / "docs" / "configuration.md").read_text()
    documented = re.findall(r"^\| `(AP_[A-Z_]+)` \| `(--[a-z-]+)` \|", table, re.MULTILINE)
    assert len(documented) >= 24
    code, out, _ = run("run", "--help")
    assert code == 0
    text = " ".join(out.split())
    help_of = {flag: text.split(f" {flag} TEXT ", 1)[-1].split(" --", 1)[0] for _, flag in documented}
    assert [env for env, flag in documented if f"[env {env}]" not in help_of[flag]] == []
    assert [flag for flag in RUN_FLAGS if f" {flag} " not in text] == []


def test_a_run_flag_is_checked_as_its_variable() -> None:
    result = CliRunner().invoke(main, ["run", "--cert-lifetime", "1w"], env={"AP_CERT_LIFETIME": None})
    assert result.exit_code == 2
    assert result.stderr.startswith("error: AP_CERT_LIFETIME='1w': expected a duration from 30s to 3650d")


def test_lint_compiles_policies_for_ci(tmp_path: Path) -> None:
    code, out, _ = run("lint", str(EXAMPLES))
    assert code == 0, out
    assert f"ok     {OFFENSIVE / 'policy.yaml'}: AdmissionPolicy 'deny-offensive-pod-names'" in out
    bad = write_policy(tmp_path / "bad.yaml", "bad", validations=[
        {"expression": "object.metadata.name.startsWith("}, {"expression": "true"}])
    code, out, _ = run("lint", str(bad), str(OFFENSIVE / "policy.yaml"), str(tmp_path / "missing.yaml"))
    assert code == 2
    assert out.splitlines()[:4] == [
        out.splitlines()[0],
        f"ok     {OFFENSIVE / 'policy.yaml'}: AdmissionPolicy 'deny-offensive-pod-names'",
        f"error  {tmp_path / 'missing.yaml'}: no such file or directory",
        "",
    ]
    assert out.startswith(f"error  {bad}: AdmissionPolicy 'bad': spec.validations[0].expression (line 1, column 33): "
                          "Syntax error")
    code, out, _ = run("lint", "-o", "json", str(bad))
    assert code == 2 and json.loads(out)["policies"][0]["name"] == "bad"
    code, out, _ = run("lint", "--help")
    assert code == 0 and "CI" in out and "exit" in out.lower()


README = (ROOT / "README.md").read_text()


def test_readme_sample_denial_is_what_the_example_returns() -> None:
    code, out, _ = run("review", "-p", str(OFFENSIVE / "policy.yaml"), "-",
                       stdin=json.dumps(review_request("offensive-pod")))
    assert code == 0
    message = json.loads(out)["response"]["status"]["message"]
    assert f'admission webhook "fail.validate.policy-operator.dev" denied the request: {message}' in README


def test_readme_links_lead_to_files_in_the_repository() -> None:
    links = re.findall(r"\]\(([^)#:]+)\)", README)
    assert "docs/design.md" in links
    assert [link for link in links if not (ROOT / link).exists()] == []
    assert "design notes" not in README.replace("[design notes](docs/design.md)", "")


def test_readme_and_cli_page_document_every_command_and_troubleshooting() -> None:
    cli_page, operations = (ROOT / "docs" / "cli.md").read_text(), (ROOT / "docs" / "operations.md").read_text()
    assert "lint" in main.commands      # type: ignore[attr-defined]
    for command in main.commands:       # type: ignore[attr-defined]
        assert f"admission-policy {command}" in README, command
        assert f"admission-policy {command}" in cli_page, command
    assert "cleanup-webhooks --name admission-policy-operator" not in README + cli_page + operations
    troubleshooting = operations.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for words in ('"path":"/metadata/finalizers"', "policy-operator.dev/exempt=true", "cleanup-webhooks",
                  "app.kubernetes.io/managed-by=admission-policy-operator", "failurePolicy"):
        assert words in troubleshooting, words


def test_a_deeply_nested_object_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Issue 18: a 500-deep object printed a RecursionError traceback (YAML parses recursively)."""
    lines = ["apiVersion: v1", "kind: Pod", "metadata: {name: deep, namespace: default}", "spec:"]
    lines += ["  " * (level + 1) + "d:" for level in range(500)] + ["  " * 501 + "x: 1"]
    (tmp_path / "deep.yaml").write_text("\n".join(lines) + "\n")
    code, out, err = run("test", "-p", str(OFFENSIVE / "policy.yaml"), str(tmp_path / "deep.yaml"))
    assert code == 2
    assert err.strip().count("\n") == 0 and "deep.yaml" in err and "nested too deeply" in err
    assert "Traceback" not in out + err
    # The same depth as JSON is read (JSON's reader goes deeper) and evaluated.
    deep: dict[str, object] = {}
    node = deep
    for _ in range(500):
        node["d"] = node = {}
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "deep", "namespace": "default"}, "spec": deep}
    (tmp_path / "deep.json").write_text(json.dumps(obj))
    code, out, err = run("test", "-p", str(OFFENSIVE / "policy.yaml"), str(tmp_path / "deep.json"))
    assert code == 0, out + err
    assert "ALLOWED" in out


def test_an_evaluation_error_is_printed_once(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", "labels", validations=[
        {"expression": "object.metadata.labels.team == 'a'"}])
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "d"}}))
    _, out, _ = run("test", "-p", str(policy), str(pod))
    assert out.count('Key not found in map : "labels"') == 1, out
    assert "field is absent" in out


# --- params and context from files: every object is read, or the input is refused --------------------------

QUOTA = EXAMPLES / "deployment-quota"
OVER_QUOTA = "to 4500m (in use: 2500m, requested: 4 \N{MULTIPLICATION SIGN} 500m), over the limit of 4"


def as_list(*paths: Path) -> str:
    """What `kubectl get ... -o yaml` prints for these objects."""
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                           "items": [yaml.safe_load(path.read_text()) for path in paths]})


def test_kubectl_list_output_and_multi_document_files_give_every_object(tmp_path: Path) -> None:
    """Objects from `kubectl get -o yaml` (a List) and multi-document files are all read: the quota
    is exceeded only when both Deployments in use are counted."""
    in_use = (QUOTA / "cluster" / "api.yaml", QUOTA / "cluster" / "worker.yaml")
    (tmp_path / "deployments.yaml").write_text(as_list(*in_use))
    (tmp_path / "quota.yaml").write_text(as_list(QUOTA / "cluster" / "quota.yaml"))
    code, out, err = run("test", "-p", str(QUOTA / "policy.yaml"), "--param", str(tmp_path / "quota.yaml"),
                         f"--context=deployments={tmp_path / 'deployments.yaml'}", str(QUOTA / "deployment-web-4.yaml"))
    assert code == 0, out + err
    assert "DENIED" in out and OVER_QUOTA in out
    (tmp_path / "deployments.yaml").write_text("\n---\n".join(path.read_text() for path in in_use))
    code, out, err = run("test", "-p", str(QUOTA / "policy.yaml"), "--param", str(tmp_path / "quota.yaml"),
                         f"--context=deployments={tmp_path / 'deployments.yaml'}", str(QUOTA / "deployment-web-4.yaml"))
    assert code == 0 and OVER_QUOTA in out, out + err


def test_each_item_of_a_list_is_an_object_to_test(tmp_path: Path) -> None:
    """A List used to be judged as one object of resource "lists": no policy matched, ALLOWED."""
    (tmp_path / "pods.yaml").write_text(as_list(OFFENSIVE / "pod-nice.yaml", OFFENSIVE / "pod-offensive.yaml"))
    code, out, err = run("test", "-p", str(OFFENSIVE / "policy.yaml"), str(tmp_path / "pods.yaml"))
    assert code == 0, out + err
    assert f"{tmp_path / 'pods.yaml'} items[0] (pods " in out and f"{tmp_path / 'pods.yaml'} items[1] (pods " in out
    assert "DENIED" in out and "lists" not in out


def test_review_reads_namespaces_from_kubectl_list_output(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", "prod-only", validations=[
        {"expression": "false", "message": "nothing runs in prod"}])
    body = yaml.safe_load(policy.read_text())
    body["spec"]["match"]["namespaceSelector"] = {"matchLabels": {"env": "prod"}}
    policy.write_text(yaml.safe_dump(body))
    (tmp_path / "namespaces.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"env": env}}}
        for name, env in (("dev", "dev"), ("default", "prod"))]}))
    code, out, err = run("review", "-p", str(policy), "-n", str(tmp_path / "namespaces.yaml"), "-",
                         stdin=json.dumps(review_request("web")))
    assert code == 0, out + err
    assert "nothing runs in prod" in json.loads(out)["response"]["status"]["message"]


@pytest.mark.parametrize(("param", "context", "words"), [
    ("- not an object\n", None, "param.yaml: expected a Kubernetes object with apiVersion and kind"),
    ("{apiVersion: v1, kind: List, items: [{kind: ConfigMap}]}\n", None,
     "param.yaml items[0]: expected a Kubernetes object with apiVersion and kind"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n[1, 2]\n", None,
     "param.yaml#2: expected a Kubernetes object with apiVersion and kind"),
    ("apiVersion: v1\nkind: Secret\nmetadata: {name: deployment-quota, namespace: team-a}\n", None,
     "param.yaml: Secret team-a/deployment-quota (v1) is not the spec.paramKind of any policy "
     "(they read ConfigMap.v1)"),
    (None, "deployment=api.yaml", "--context deployment: no policy declares context 'deployment' in spec.context "
                                  "(declared: deployments)"),
    (None, "deployments=quota.yaml", "quota.yaml: ConfigMap team-a/deployment-quota (v1) is not what context "
                                     "'deployments' of AdmissionPolicy 'deployment-quota' lists: deployments of "
                                     "API group apps (spec.context[0])"),
])
def test_params_and_context_no_policy_would_read_are_refused(tmp_path: Path, param: str | None, context: str | None,
                                                              words: str) -> None:
    """A typo'd file used to be dropped without a word, and the object judged without it."""
    args = ["test", "-p", str(QUOTA / "policy.yaml")]
    if param is not None:
        (tmp_path / "param.yaml").write_text(param)
        args += ["--param", str(tmp_path / "param.yaml")]
    if context is not None:
        name, _, file = context.partition("=")
        args += ["--context", f"{name}={QUOTA / 'cluster' / file}"]
    code, out, err = run(*args, str(QUOTA / "deployment-web-4.yaml"))
    assert code == 2, out + err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_suite_reads_lists_and_multi_document_files_and_refuses_an_undeclared_context(tmp_path: Path) -> None:
    copy = tmp_path / "quota"
    shutil.copytree(QUOTA, copy)
    (copy / "cluster" / "in-use.yaml").write_text(as_list(QUOTA / "cluster" / "api.yaml",
                                                          QUOTA / "cluster" / "worker.yaml"))
    suite = yaml.safe_load((copy / "test.yaml").read_text())
    suite["context"] = {"deployments": ["cluster/in-use.yaml"]}
    (copy / "test.yaml").write_text(yaml.safe_dump(suite, allow_unicode=True))
    code, out, err = run("test", str(copy))
    assert code == 0, out + err

    suite["cases"][0]["context"] = {"deployment": ["cluster/api.yaml"]}
    (copy / "test.yaml").write_text(yaml.safe_dump(suite, allow_unicode=True))
    code, out, _ = run("test", str(copy))
    assert code == 1
    assert (f"FAIL  {suite['cases'][0]['name']}\n        cannot run: cases[0].context.deployment: no policy declares "
            "context 'deployment' in spec.context (declared: deployments)") in out


# --- feature gates offline ------------------------------------------------------------------------------

IMAGES = EXAMPLES / "image-references"


@pytest.mark.parametrize("command", [
    ["test", "-p", str(IMAGES / "policy.yaml"), str(IMAGES / "pod-no-digest.yaml")],
    ["lint", str(IMAGES / "policy.yaml")],
    ["review", "-p", str(IMAGES / "policy.yaml"), "-"],
    ["audit", "-p", str(IMAGES / "policy.yaml"), str(IMAGES / "pod-no-digest.yaml")],
])
def test_bad_feature_gates_are_one_line_naming_their_origin(command: list[str]) -> None:
    result = CliRunner().invoke(main, command, env={"AP_FEATURE_GATES": "ImageReferencePlugin=false"},
                                input=json.dumps(review_request("web")))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: AP_FEATURE_GATES: unknown feature gate 'ImageReferencePlugin' (known: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    code, _, err = run(*command[:1], "--feature-gates", "ImageReferencesPlugin=off", *command[1:],
                       stdin=json.dumps(review_request("web")))
    assert code == 2 and err == ("error: --feature-gates: feature gate 'ImageReferencesPlugin=off': "
                                 "expected Name=true or Name=false\n")


def test_a_gated_off_plugin_is_said_to_be_skipped(tmp_path: Path) -> None:
    """Offline as in the cluster, the plugin's rules are skipped; the CLI says so rather than let
    "ok" or "ALLOWED" pass for a check that never ran."""
    off = ("--feature-gates", "ImageReferencesPlugin=false")
    skipped = (f"{IMAGES / 'policy.yaml'}: AdmissionPolicy 'image-references': spec.validations[1].plugin: plugin "
               "'image-references' is switched off by feature gate ImageReferencesPlugin=false; this rule is skipped")
    code, out, _ = run("lint", *off, str(IMAGES / "policy.yaml"))
    assert code == 0, out
    assert f"warn   {skipped}" in out and "1 with plugin rules a feature gate switches off" in out
    code, out, _ = run("lint", *off, "-o", "json", str(IMAGES / "policy.yaml"))
    assert code == 0 and json.loads(out)["policies"][0]["warnings"] == [skipped]

    code, out, err = run("test", *off, "-p", str(IMAGES / "policy.yaml"), str(IMAGES / "pod-no-digest.yaml"))
    assert code == 0 and "ALLOWED" in out, out + err
    assert f"warning: {skipped}" in err
    code, out, err = run("review", *off, "-p", str(IMAGES / "policy.yaml"), "-",
                         stdin=json.dumps(review_request("web")))
    assert code == 0 and json.loads(out)["response"]["allowed"] is True
    assert f"warning: {skipped}" in err
    # Without the flag the same pod is denied, and nothing is said about gates.
    code, out, err = run("test", "-p", str(IMAGES / "policy.yaml"), str(IMAGES / "pod-no-digest.yaml"))
    assert "DENIED" in out and "warning" not in err
