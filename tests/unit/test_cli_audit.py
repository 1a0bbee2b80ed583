"""``admission-policy audit`` on manifests: inputs, table, reports, exit codes."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import builders
from admission_policy.cli import main
from builders import policy_body, rule

EXAMPLES = Path(__file__).parents[2] / "examples"
NEEDS_TEAM = {"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
              "message": "a team label is required"}


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def write_policy(path: Path, enforcement: str = "Enforce", name: str = "team-label") -> Path:
    path.write_text(yaml.safe_dump(policy_body(name, rules=[rule("configmaps", "namespaces")], enforcement=enforcement,
                                               validations=[NEEDS_TEAM])))
    return path


configmap = functools.partial(builders.configmap, namespace="apps")


MANIFESTS = "\n---\n".join(yaml.safe_dump(doc) for doc in (
    {"apiVersion": "v1", "kind": "List", "items": [configmap("bad"), configmap("good", labels={"team": "a"})]},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}},
    configmap("no-namespace", namespace=None),
))


def test_a_table_per_policy_and_exit_1_for_an_enforce_violation(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    (tmp_path / "objects.yaml").write_text(MANIFESTS)
    code, out, _ = run("audit", "-p", str(policy), str(tmp_path / "objects.yaml"))
    assert code == 1, out
    assert "team-label (Enforce): 4 object(s): 3 fail, 1 pass" in out
    assert "fail    ConfigMap apps/bad" in out and "ConfigMap default/no-namespace" in out
    assert "Namespace apps" in out and "a team label is required" in out
    assert "good" not in out   # passes are counted, not listed
    assert "an Enforce policy is violated" in out


@pytest.mark.parametrize("enforcement", ["Audit", "Warn"])
def test_violations_of_other_policies_exit_0(tmp_path: Path, enforcement: str) -> None:
    policy = write_policy(tmp_path / "policy.yaml", enforcement)
    code, out, _ = run("audit", "-p", str(policy), "-", stdin=MANIFESTS)
    assert code == 0, out
    assert ("3 warn" if enforcement == "Warn" else "3 fail") in out


def test_json_and_yaml_are_the_reports_the_operator_writes(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml")
    code, out, _ = run("audit", "-p", str(policy), "-o", "json", "-", stdin=MANIFESTS)
    assert code == 1
    listing = json.loads(out)
    assert listing["kind"] == "List"
    kinds = {(item["kind"], item["metadata"].get("namespace")): item for item in listing["items"]}
    assert set(kinds) == {("ClusterReport", None), ("Report", "apps"), ("Report", "default")}
    apps = kinds["Report", "apps"]
    assert apps["apiVersion"] == "openreports.io/v1alpha1"
    assert apps["summary"]["fail"] == 1 and apps["summary"]["pass"] == 1
    assert apps["results"][0]["resources"][0]["name"] == "bad" and apps["results"][0]["rule"] == "spec.validations[0]"
    code, out, _ = run("audit", "-p", str(policy), "-o", "yaml", "-", stdin=MANIFESTS)
    assert untimed(yaml.safe_load(out)["items"]) == untimed(listing["items"])


def untimed(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reports without their results' timestamps (two runs may straddle a second)."""
    for report in reports:
        for result in report["results"]:
            assert isinstance(result.pop("timestamp")["seconds"], int)
    return reports


def test_a_directory_of_manifests_skips_policies_and_suites() -> None:
    example = EXAMPLES / "require-team-label-enforce"
    code, out, err = run("audit", "-p", str(example / "policy.yaml"), str(example))
    assert code == 1, out + err
    assert "require-team-label-enforce (Enforce): 4 object(s): 3 fail, 1 pass" in out
    assert "StatefulSet shop/ledger-db" in out and "must carry a non-empty team label" in out
    assert "AdmissionPolicyTest" not in out and "admissionpolicytests" not in out


def test_a_policy_that_only_judges_updates_says_it_audits_nothing(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    body = yaml.safe_load(write_policy(policy).read_text())
    body["spec"]["match"]["resources"][0]["operations"] = ["UPDATE"]
    policy.write_text(yaml.safe_dump(body))
    code, out, _ = run("audit", "-p", str(policy), "-", stdin=MANIFESTS)
    assert code == 0 and "no object matched (no rule names CREATE: nothing to audit)" in out


@pytest.mark.parametrize(("args", "stdin", "words"), [
    (["-p", "POLICY"], None, "nothing to audit"),
    (["-p", "POLICY", "--kubeconfig", "k", "x.yaml"], None, "not both"),
    (["-p", "POLICY", "-"], "kind: ConfigMap\n", "expected a Kubernetes object with apiVersion and kind"),
    (["-p", "POLICY", "-"], "{apiVersion: v1, kind: List, items: 3}\n", "List.items must be a list"),
    (["-p", "POLICY", "missing.yaml"], None, "missing.yaml: no such file"),
])
def test_unusable_input_exits_2_with_one_line(tmp_path: Path, args: list[str], stdin: str | None, words: str) -> None:
    policy = str(write_policy(tmp_path / "policy.yaml"))
    code, out, err = run("audit", *[policy if a == "POLICY" else a for a in args], stdin=stdin)
    assert code == 2, out + err
    assert words in err and "Traceback" not in err


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    code, out, err = run("audit", "-p", str(write_policy(tmp_path / "policy.yaml")), "--kubeconfig", str(kubeconfig),
                         "--progress", "never")
    assert code == 2, out + err
    assert f"cannot audit the cluster of {kubeconfig}" in err and "Traceback" not in err


def test_policies_that_read_params_and_context_get_them_from_files() -> None:
    """The quota example over team-a's Deployments: api + web + worker request 4.5 CPU of 4, so
    each one, created now, would be refused; without the context files each is an error naming
    the context and the flag."""
    example = EXAMPLES / "deployment-quota"
    cluster = [str(example / "cluster" / f"{name}.yaml") for name in ("api", "web-4", "worker")]
    code, out, _ = run("audit", "-p", str(example / "policy.yaml"), "--param", str(example / "cluster" / "quota.yaml"),
                       *(f"--context=deployments={path}" for path in cluster), *cluster)
    assert code == 1, out
    assert "deployment-quota (Enforce): 3 object(s): 3 fail" in out
    assert "Deployment web would bring the CPU requested by Deployments in namespace team-a to 4500m " \
           "(in use: 2500m, requested: 4 \N{MULTIPLICATION SIGN} 500m), over the limit of 4 in ConfigMap " \
           "team-a/deployment-quota" in out

    code, out, _ = run("audit", "-p", str(example / "policy.yaml"), *cluster)
    assert code == 0, out   # errors, not violations
    assert "3 error" in out and "--context deployments=FILE_OR_DIR" in out


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    """It used to read "Expected key current-context", after a stray "Config not found" line."""
    missing = tmp_path / "kubeconfig"
    code, out, err = run("audit", "-p", str(write_policy(tmp_path / "policy.yaml")), "--kubeconfig", str(missing))
    assert code == 2, out + err
    assert err == f"error: --kubeconfig {missing}: no such file\n"
    missing.write_text("apiVersion: v1\nkind: Config\n")
    code, out, err = run("audit", "-p", str(write_policy(tmp_path / "policy.yaml")), "--kubeconfig", str(missing))
    assert code == 2 and err == f"error: --kubeconfig {missing}: not a kubeconfig with a current-context\n"
