"""``admission-policy lint``: could each AdmissionPolicy be a ValidatingAdmissionPolicy, and if not,
which field or expression stops it; what ports only with a translation is a note."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from admission_policy.cli import main
from admission_policy.engine import load_policy
from admission_policy.vap.portability import BASELINE, KubernetesCel, Portability, portability
from builders import POD_RULE, policy_body, rule

ROOT = Path(__file__).parents[2]
SECRETS = rule("secrets")
CHECK = {"expression": "object.metadata.name != 'x'", "reason": "Forbidden"}


def body(name: str = "p", **spec: Any) -> dict[str, Any]:
    """A policy on Secrets, validating CHECK unless it mutates."""
    if "mutations" not in spec:
        spec.setdefault("validations", [CHECK])
    return policy_body(name, rules=[SECRETS], **spec)


def verdict(policy: dict[str, Any], environment: KubernetesCel | None = None) -> Portability:
    return portability(load_policy(policy, "Fail"), policy, environment)


@pytest.mark.parametrize(("spec", "blockers"), [
    pytest.param({}, [], id="validations only"),
    pytest.param({"mutations": [{"merge": {"metadata": {"labels": {"a": "b"}}}}]}, ["spec.mutations"],
                 id="mutations"),
    pytest.param({"validations": [CHECK, {"plugin": {"name": "tls-secrets", "config": {"minRemainingDays": 7}}}]},
                 ["spec.validations[1].plugin"], id="plugin"),
    # Reading context is not reported twice: spec.context says it.
    pytest.param({"context": [{"name": "all", "version": "v1", "resource": "secrets"}],
                  "validations": [{"expression": "size(context.all) < 10", "reason": "Forbidden"}]},
                 ["spec.context"], id="context"),
    pytest.param({"variables": [{"name": "q", "expression": "formatQuantity(quantity('1.5'))"}]},
                 ["spec.variables[0].expression"], id="formatQuantity"),
    pytest.param({"variables": [{"name": "b", "expression": "base64.encode(b'x')"}]},
                 ["spec.variables[0].expression"], id="encoders"),
    pytest.param({"variables": [{"name": "m", "expression": "math.greatest([1, 2])"}]},
                 ["spec.variables[0].expression"], id="math"),
    pytest.param({"variables": [{"name": "b", "expression": "cel.bind(n, object.metadata.name, n + n)"}]},
                 ["spec.variables[0].expression"], id="cel.bind"),
    # What Kubernetes has beyond cel-expr-python's base: cross-type comparisons, ext lists, sets.
    pytest.param({"variables": [{"name": "k", "expression": "[1, 2].sum() < 2.5 && [3, 1].sort() == [1, 3] && "
                                                            "sets.contains([1, 2], [1]) && [1].existsOne(x, x == 1)"}]},
                 [], id="kubernetes extensions"),
    pytest.param({"match": {"resources": [SECRETS], "conditions": [
        {"name": "big", "expression": "quantity(object.data.size) > quantity('1Gi')"}]}},
                 ["spec.match.conditions[0].expression"], id="< on quantities"),
    pytest.param({"validations": [{"expression": "quantity(object.data.size).isLessThan(quantity('1Gi'))",
                                   "messageExpression": "'too big: ' + formatQuantity(quantity(object.data.size))",
                                   "reason": "Forbidden"}]},
                 ["spec.validations[0].messageExpression"], id="message"),
    # Kubernetes checks match conditions without the policy's variables, messages without the authorizer.
    pytest.param({"variables": [{"name": "n", "expression": "object.metadata.name"}],
                  "match": {"resources": [SECRETS], "conditions": [{"name": "c", "expression": "variables.n != 'x'"}]}},
                 ["spec.match.conditions[0].expression"], id="variables in a match condition"),
    pytest.param({"validations": [{"expression": "true", "reason": "Forbidden", "messageExpression":
                                   "authorizer.group('').resource('secrets').check('get').allowed() ? 'a' : 'b'"}]},
                 ["spec.validations[0].messageExpression"], id="authorizer in a message"),
    pytest.param({"validations": [{"expression": "authorizer.group('').resource('secrets').check('get').allowed()",
                                   "reason": "Forbidden"}]}, [], id="authorizer in a validation"),
])
def test_what_stops_a_policy(spec: dict[str, Any], blockers: list[str]) -> None:
    found = verdict(body(**spec))
    assert [finding.path for finding in found.blockers] == blockers
    assert found.portable is not blockers


def test_a_blocking_expression_names_the_function_and_column() -> None:
    found = verdict(body(variables=[{"name": "q", "expression": "string(formatQuantity(quantity('1')))"}]),
                    )
    assert [str(finding) for finding in found.blockers] == [
        "spec.variables[0].expression: (line 1, column 22) not in Kubernetes' CEL environment: "
        "undeclared reference to 'formatQuantity'"]


@pytest.mark.parametrize(("expression", "mixed"), [
    ("[1, 2].size() > 0", None),
    ("[dyn(object.metadata.name), dyn(1)].size() > 0", None),
    ("{'a': dyn(1), 'b': dyn('x')}.size() > 0", None),
    ("{?'a': optional.of(1), 'b': 2}.size() > 0", None),        # ?key: the optional's value type
    ("'%s is %d'.format(['a', 1]) != ''", None),                # format()'s arguments are exempt
    ("[object.metadata.name, 'x'].size() > 0", "(line 1, column 1) a list literal mixes dyn and string"),
    ("{'a': 1, 'b': dyn('x')}.size() > 0", "(line 1, column 1) a map literal mixes int and dyn"),
    ("[1, 'a'].size() > 0", "(line 1, column 1) a list literal mixes int and string"),
    ("size({'a': 1, 'b': 'x'}) > 0", "(line 1, column 6) a map literal mixes int and string"),
    ("{1: 'a', 'b': 'c'}.size() > 0", "(line 1, column 1) a map literal mixes int and string"),
    ("[[1], ['a']].size() > 0", "(line 1, column 1) a list literal mixes list(int) and list(string)"),
    ("true &&\n  [1, 2.0].size() > 0", "(line 2, column 3) a list literal mixes int and double"),
])
def test_list_and_map_literals_of_mixed_types_do_not_port(expression: str, mixed: str | None) -> None:
    """Kubernetes' CEL (cel-go's homogeneous aggregate literal validator: equivalent types, a dyn
    only with a dyn) refuses them when the API server creates the policy; this project's CEL takes them."""
    found = [str(finding) for finding in verdict(body(validations=[{"expression": expression}])).blockers]
    if mixed is None:
        assert found == []
    else:
        (only,) = found
        assert only.startswith(f"spec.validations[0].expression: {mixed}, which Kubernetes' CEL refuses"), only


@pytest.mark.parametrize(("expression", "kubernetes", "needs"), [
    ("object.metadata.name.startsWith('a')", BASELINE, []),
    ("semver(object.data.version).major() >= 2", "1.33",
     ["spec.validations[0].expression: needs Kubernetes 1.33 or later (library semver)"]),
    ("isSemver(object.data.v) && object.data.v.matches('^[0-9]')", "1.33",
     ["spec.validations[0].expression: needs Kubernetes 1.33 or later (library semver)"]),
])
def test_the_oldest_kubernetes_a_portable_policy_runs_on(expression: str, kubernetes: str, needs: list[str]) -> None:
    found = verdict(body(validations=[{"expression": expression, "reason": "Forbidden"}]))
    assert (found.portable, found.kubernetes, [str(f) for f in found.needs]) == (True, kubernetes, needs)


@pytest.mark.parametrize(("spec", "notes"), [
    pytest.param({}, [], id="none"),
    pytest.param({"match": {"resources": [SECRETS], "excludeNamespaces": ["b", "a"]}},
                 ["spec.match.excludeNamespaces: a ValidatingAdmissionPolicy has none: add the namespaceSelector "
                  "requirement {key: kubernetes.io/metadata.name, operator: NotIn, values: [a, b]}"],
                 id="excludeNamespaces"),
    pytest.param({"match": {"resources": [{**SECRETS, "resources": ["secrets/*"]}]}},
                 ["spec.match.resources[0].resources: 'secrets/*' in a ValidatingAdmissionPolicy rule also matches "
                  "'secrets' itself: exclude it with excludeResourceRules"], id="subresources only"),
    pytest.param({"match": {"resources": [{**SECRETS, "resources": ["secrets", "secrets/*"]}]}}, [],
                 id="resource and subresources"),
    pytest.param({"validations": [{"expression": "true"}]},
                 ["spec.validations[0].reason: unset: a denial is 403 Forbidden here but 422 Invalid from a "
                  "ValidatingAdmissionPolicy; set it to keep the code"], id="reason unset"),
    pytest.param({"reportAdmission": True}, ["spec.reportAdmission: the reports are this operator's (a "
                                             "ValidatingAdmissionPolicy's Audit action writes to the API server's "
                                             "audit log)"], id="reportAdmission"),
    pytest.param({"match": {"resources": [POD_RULE]}, "podControllers": ["Deployment"]},
                 ["spec.podControllers: this policy also judges the Pod templates of Deployment; a "
                  "ValidatingAdmissionPolicy on Pods judges Pods only"], id="Pod templates"),
    pytest.param({"match": {"resources": [POD_RULE]}, "podControllers": []}, [], id="Pods only"),
    pytest.param({"failurePolicy": "Ignore",
                  "variables": [{"name": "names", "expression": "object.spec.containers.map(c, c.name)"},
                                {"name": "bad", "expression": "object.spec.containers.filter(c, c.image == '')"},
                                {"name": "listed", "expression": "variables.bad.map(c, c.name)"}],
                  "validations": [
                      {"expression": "size(variables.names) < 10", "reason": "Forbidden",
                       "messageExpression": "'too many: ' + variables.names.join(', ')"},
                      {"expression": "object.spec.containers.all(c, c.image != '')", "reason": "Forbidden",
                       "messageExpression": "'no image: ' + variables.listed.join(', ')"}]},
                 ["spec.validations[1].messageExpression: reads variables.listed, which no validation reads: under "
                  "failurePolicy Ignore a ValidatingAdmissionPolicy evaluates every messageExpression on every "
                  "request, so it computes it for every request, not only for a denial"],
                 id="a message's own variables"),
    # Under Fail, the generated any-validation-fails condition spares an admitted request the messages.
    pytest.param({"variables": [{"name": "bad", "expression": "object.spec.containers.filter(c, c.image == '')"}],
                  "validations": [{"expression": "object.spec.containers.all(c, c.image != '')", "reason": "Forbidden",
                                   "messageExpression": "'no image: ' + variables.bad.map(c, c.name).join(', ')"}]},
                 [], id="a message's own variables, under Fail"),
])
def test_what_ports_with_a_translation(spec: dict[str, Any], notes: list[str]) -> None:
    found = verdict(body(**spec))
    assert found.portable
    assert [str(finding) for finding in found.notes] == notes


# --- the command ----------------------------------------------------------------------------------------

def write(path: Path, *policies: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(policies))
    return path


def test_lint_says_which_policies_are_portable_after_the_compile_results(tmp_path: Path) -> None:
    path = write(tmp_path / "policies.yaml", body("plain"), body("mutates", mutations=[{"merge": {"a": 1}}]),
                 body("versioned", validations=[{"expression": "isSemver(object.data.v)", "reason": "Forbidden"}]),
                 body("broken", validations=[{"expression": "nope("}]))
    result = CliRunner().invoke(main, ["lint", str(path)])
    assert result.exit_code == 2   # "broken" does not compile; portability alone never fails lint
    lines = result.stdout.splitlines()
    section = lines[lines.index("As a ValidatingAdmissionPolicy:") + 1:]
    assert section == [
        f"portable      {path}#1: AdmissionPolicy 'plain'",
        f"not portable  {path}#2: AdmissionPolicy 'mutates': spec.mutations: a ValidatingAdmissionPolicy only "
        "validates (Kubernetes' MutatingAdmissionPolicy mutates, with an API of its own)",
        f"portable      {path}#3: AdmissionPolicy 'versioned' (Kubernetes 1.33 or later)",
        f"needs         {path}#3: AdmissionPolicy 'versioned': spec.validations[0].expression: needs Kubernetes 1.33 "
        "or later (library semver)",
        "",
        "2 of 3 portable to ValidatingAdmissionPolicy",
    ]
    assert lines.index("3 compiled, 1 with errors") < lines.index("As a ValidatingAdmissionPolicy:")


def test_lint_json_and_require_portable(tmp_path: Path) -> None:
    portable = write(tmp_path / "portable.yaml", body("plain"))
    mutating = write(tmp_path / "mutating.yaml", body("mutates", mutations=[{"merge": {"a": 1}}]))
    result = CliRunner().invoke(main, ["lint", "-o", "json", str(portable), str(mutating)])
    assert result.exit_code == 0
    reports = [policy["portability"] for policy in json.loads(result.stdout)["policies"]]
    assert reports == [
        {"portable": True, "kubernetes": BASELINE, "blockers": [], "needs": [], "notes": []},
        {"portable": False, "kubernetes": BASELINE, "needs": [], "notes": [],
         "blockers": ["spec.mutations: a ValidatingAdmissionPolicy only validates (Kubernetes' "
                      "MutatingAdmissionPolicy mutates, with an API of its own)"]},
    ]
    assert CliRunner().invoke(main, ["lint", "--require-portable", str(portable)]).exit_code == 0
    assert CliRunner().invoke(main, ["lint", "--require-portable", str(portable), str(mutating)]).exit_code == 2


def test_a_policy_that_does_not_compile_gets_no_verdict(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.yaml", body("broken", validations=[{"expression": "nope("}]))
    result = CliRunner().invoke(main, ["lint", "-o", "json", str(path)])
    assert json.loads(result.stdout)["policies"][0]["portability"] is None
    assert "As a ValidatingAdmissionPolicy" not in CliRunner().invoke(main, ["lint", str(path)]).stdout


def test_converted_policies_are_portable_back() -> None:
    result = CliRunner().invoke(main, ["lint", str(ROOT / "examples" / "from-vap")])
    assert result.exit_code == 0
    assert "2 of 2 portable to ValidatingAdmissionPolicy" in result.stdout
    assert "not portable" not in result.stdout and "note " not in result.stdout
