"""Type checking against the schemas of the matched kinds (engine/typecheck.py): the same answers
as Kubernetes' own checker for the same expressions and schemas, where Kubernetes is right.

The first two tables follow Kubernetes' tests of its ValidatingAdmissionPolicy type checker
(``TestExtractTypeNames`` and ``TestTypeCheck`` in apiserver's
``admission/plugin/policy/validating/typechecking_test.go``): the kinds a policy is checked
against, and, with the schema of every kind replaced by one given schema, the warnings. Where
this checker answers otherwise, the case says why. The CRD-schema cases after them follow what
Kubernetes' schema-to-CEL conversion makes ``dyn`` (int-or-string, unknown fields, embedded
resources); the last ones are where Kubernetes cries wolf and this must not.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from admission_policy import api
from admission_policy.cli import main
from admission_policy.engine import PolicyCompileError, compile_policy
from admission_policy.engine.kinds import _QUANTITIES, Catalog
from admission_policy.engine.typecheck import matched_kinds, type_check

DEPLOYMENTS = {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "operations": ["CREATE"]}
PODS = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}


def policy(*, rules: list[dict[str, Any]] | None = None, validations: list[dict[str, Any]] | None = None,
           **spec: Any) -> api.AdmissionPolicy:
    body = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": "p"},
            "spec": {"match": {"resources": rules if rules is not None else [DEPLOYMENTS]},
                     "validations": validations if validations is not None else [{"expression": "true"}], **spec}}
    return compile_policy(api.parse_policy(body)).policy


def crd(group: str, plural: str, kind: str, schema: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


def every_kind(schema: dict[str, Any] | None) -> Catalog:
    """As Kubernetes' test resolver: Deployments, and the params' kind, all have ``schema``
    (None: no schema is found)."""
    if schema is None:
        return Catalog([])
    return Catalog([crd("apps", "deployments", "Deployment", schema), crd("example.com", "configs", "Config", schema)])


def warnings(checked_policy: api.AdmissionPolicy, catalog: Catalog) -> list[tuple[str, str]]:
    return [(w.field_ref, w.warning) for w in type_check(checked_policy, catalog).warnings]


@pytest.mark.parametrize(("rules", "expected"), [
    pytest.param([], [], id="empty"),
    pytest.param([DEPLOYMENTS], ["apps/v1, Kind=Deployment"], id="specific"),
    pytest.param([DEPLOYMENTS, PODS], ["v1, Kind=Pod", "apps/v1, Kind=Deployment"], id="multiple"),
    pytest.param([{**DEPLOYMENTS, "resources": ["*"]}], [], id="all resources"),
    pytest.param([{**DEPLOYMENTS, "resources": ["pods/*"]}], [], id="sub resources"),
    pytest.param([DEPLOYMENTS, {**DEPLOYMENTS, "apiVersions": ["*"]}], ["apps/v1, Kind=Deployment"], id="mixtures"),
])
def test_the_kinds_checked_are_those_kubernetes_picks(rules: list[dict[str, Any]], expected: list[str]) -> None:
    # "empty" has no rule at all here: a policy needs one, so a rule on a resource nobody serves.
    rules = rules or [{**DEPLOYMENTS, "apiGroups": ["example.com"], "resources": ["nothing"]}]
    assert [str(kind) for kind in matched_kinds(policy(rules=rules), Catalog())] == expected


STRING_FOO = {"type": "object", "properties": {"foo": {"type": "string"}}}
INT_FOO = {"type": "object", "properties": {"foo": {"type": "integer", "format": "int64"}}}
PARAMS = {"paramKind": {"apiVersion": "example.com/v1", "kind": "Config"}, "paramRef": {"name": "config"}}


@pytest.mark.parametrize(("schema", "spec", "expected"), [
    # No schema for the kind (here a custom one without its CRD; Deployment's is built in).
    pytest.param(None, {"validations": [{"expression": "object.foo == 'bar'"}], "rules": [
        {**DEPLOYMENTS, "apiGroups": ["example.com"], "resources": ["widgets"]}]}, [], id="unresolved schema"),
    pytest.param(STRING_FOO, {"validations": [{"expression": "object.foo == 'bar'"}]}, [], id="passed check"),
    pytest.param({"type": "object", "properties": {"bar": {"type": "string"}}},
                 {"validations": [{"expression": "object.foo == 'bar'"}]},
                 [("spec.validations[0].expression", "undefined field 'foo'")], id="undefined field"),
    pytest.param(INT_FOO, {"validations": [{"expression": "object.foo == 'bar'"}]},
                 [("spec.validations[0].expression", "found no matching overload")], id="field type mismatch"),
    pytest.param(STRING_FOO, {"validations": [{"expression": "object.foo == params.bar"}], **PARAMS},
                 [("spec.validations[0].expression", "undefined field 'bar'")], id="params"),
    pytest.param({}, {"validations": [{"expression": "params != null"}], **PARAMS}, [],
                 id="params with untyped schema"),
    pytest.param(STRING_FOO, {"validations": [{"expression": "object.foo == 'bar'"},
                                              {"expression": "object.bar == 'foo'"}]},
                 [("spec.validations[1].expression", "undefined field 'bar'")], id="multiple expressions"),
    # Kubernetes' message ("object.foo + 114514") is refused here when compiled: not a string.
    pytest.param(INT_FOO, {"validations": [{"expression": "object.foo == 1",
                                            "messageExpression": "object.foo + ' is wrong'"}]},
                 [("spec.validations[0].messageExpression", "found no matching overload")], id="message expressions"),
    pytest.param(STRING_FOO, {"validations": [
        {"expression": "authorizer.group('').resource('endpoints').check('create').allowed()"}]}, [], id="authorizer"),
    pytest.param({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"text": {"type": "string"}}},
        "status": {"type": "object", "properties": {
            "problematicProperty": {"type": "object", "additionalProperties": True}}}}},
        {"validations": [{"expression": "has(object.spec.text)"}]}, [], id="additionalProperties: true"),
    pytest.param({}, {"validations": [{"expression": "true"}]}, [], id="schema without type"),
    pytest.param(INT_FOO, {"variables": [{"name": "works", "expression": "true"}],
                           "validations": [{"expression": "variables.works"}]}, [], id="variables valid"),
    pytest.param(INT_FOO, {"variables": [{"name": "name", "expression": "'something'"}],
                           "validations": [{"expression": "variables.name == object.foo"}]},
                 [("spec.validations[0].expression",
                   "found no matching overload for '_==_' applied to '(string, int)'")],
                 id="variables field wrong type"),
    # Kubernetes says nothing of a variable that does not check ("error in variables, not reported
    # during type checking"): a typo in a variable is the same mistake as in a validation, so it
    # is reported here, once, at the variable; the variable is then dyn for those that read it.
    pytest.param(INT_FOO, {"variables": [{"name": "name", "expression": "object.foo == 'str'"}],
                           "validations": [{"expression": "variables.name == object.foo"}]},
                 [("spec.variables[0].expression", "found no matching overload")],
                 id="error in variables, reported at the variable"),
])
def test_the_warnings_are_kubernetes(schema: dict[str, Any] | None, spec: dict[str, Any],
                                     expected: list[tuple[str, str]]) -> None:
    found = warnings(policy(**spec), every_kind(schema))
    assert [field for field, _ in found] == [field for field, _ in expected], found
    for (_, warning), (_, text) in zip(found, expected, strict=True):
        assert warning.startswith("apps/v1, Kind=Deployment: ") and text in warning, warning


@pytest.mark.parametrize(("spec", "error"), [
    pytest.param({"validations": [{"expression": "authorizer.allowed()"}]},
                 "found no matching overload for 'allowed' applied to '(kubernetes.authorization.Authorizer)'",
                 id="authorizer invalid"),
    pytest.param({"variables": [{"name": "works", "expression": "true"}],
                  "validations": [{"expression": "variables.nonExisting"}]},
                 "variables.nonExisting is not declared", id="variables missing field"),
])
def test_what_kubernetes_warns_of_without_a_schema_does_not_compile(spec: dict[str, Any], error: str) -> None:
    """Kubernetes' checker warns of these; they need no schema to be wrong, and the policy is refused."""
    with pytest.raises(PolicyCompileError, match=re.escape(error)):
        policy(**spec)


WIDGETS = {"apiGroups": ["example.com"], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE"]}


def widget(properties: dict[str, Any]) -> Catalog:
    return Catalog([crd("example.com", "widgets", "Widget",
                        {"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}})])


@pytest.mark.parametrize(("properties", "expression", "expected"), [
    pytest.param({"port": {"x-kubernetes-int-or-string": True}}, "object.spec.port == 'http' || object.spec.port == 80",
                 None, id="int-or-string is dyn"),
    pytest.param({"extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                 "object.spec.extra.anything.at.all == 1", None, id="unknown fields are dyn"),
    pytest.param({"template": {"type": "object", "x-kubernetes-embedded-resource": True,
                               "x-kubernetes-preserve-unknown-fields": True}},
                 "object.spec.template.kind == 'Pod'", None, id="an embedded resource is dyn"),
    pytest.param({"sizes": {"type": "object", "additionalProperties": {"type": "integer"}}},
                 "object.spec.sizes.all(k, object.spec.sizes[k] > 0)", None, id="a map of integers"),
    pytest.param({"sizes": {"type": "object", "additionalProperties": {"type": "integer"}}},
                 "object.spec.sizes['a'] == 'big'", "found no matching overload", id="a map's values are typed"),
    pytest.param({"items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}},
                 "object.spec.items.all(i, i.nmae != '')", "undefined field 'nmae'", id="a list of objects"),
    pytest.param({"grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}},
                 "object.spec.grid.all(row, row.all(cell, cell > 0))", None, id="a list of lists"),
    pytest.param({"when": {"type": "string", "format": "date-time"}},
                 "timestamp(object.spec.when) < timestamp('2030-01-01T00:00:00Z')", None,
                 id="a date-time is the string the request holds"),
    pytest.param({"odd-name": {"type": "string"}}, "object.spec['odd-name'] == 'x'", None,
                 id="a property that is no identifier leaves its object dyn"),
    pytest.param({"color": {"type": "string"}}, "object.metadata.labels['team'] == object.spec.color", None,
                 id="a CRD's metadata is ObjectMeta"),
    pytest.param({"color": {"type": "string"}}, "object.metadata.lables['team'] == 'a'", "undefined field 'lables'",
                 id="a typo in a CRD's metadata"),
])
def test_crd_schemas_are_typed_as_kubernetes_types_them(properties: dict[str, Any], expression: str,
                                                         expected: str | None) -> None:
    found = warnings(policy(rules=[WIDGETS], validations=[{"expression": expression}]), widget(properties))
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0][1], found


@pytest.mark.parametrize(("rules", "expression"), [
    # Kubernetes 1.32: "undefined field 'limits'" (it cannot type a map of quantities).
    pytest.param([DEPLOYMENTS], "object.spec.template.spec.containers.all(c, has(c.resources.limits))",
                 id="map of quantities on a Deployment"),
    pytest.param([{**PODS, "resources": ["nodes"]}], "object.status.allocatable['cpu'] != '0'",
                 id="a Node's allocatable"),
    pytest.param([PODS], "object.spec.containers.all(c, !has(c.resources.limits) || !('cpu' in c.resources.limits) "
                         "|| quantity(string(c.resources.limits.cpu)).isLessThan(quantity('2')))",
                 id="a quantity read as a string"),
    pytest.param([PODS], "object.spec.containers.exists(c, c.ports.exists(p, p.containerPort == 80))",
                 id="an int field"),
    pytest.param([PODS], "object.spec.containers.all(c, !has(c.livenessProbe) || c.livenessProbe.httpGet.port != 0)",
                 id="int-or-string port"),
    # A request's object is a map: these work on it, though a message type refuses them.
    pytest.param([PODS], "(object.spec.containers + object.spec.?ephemeralContainers.orValue([])).all(c, c.name != '')",
                 id="containers and ephemeral containers together"),
    pytest.param([PODS], "object.spec.?securityContext.orValue({}).?runAsNonRoot.orValue(false) || true",
                 id="orValue of an empty map"),
    pytest.param([PODS], "object.spec.volumes.all(v, v.all(k, k == 'name' || k != 'hostPath'))",
                 id="iterating over an object's keys"),
    pytest.param([PODS], "object.metadata.name != null && object.spec.hostNetwork != null",
                 id="a field compared with null (JSON may hold null)"),
])
def test_no_warning_where_the_expression_works(rules: list[dict[str, Any]], expression: str) -> None:
    assert warnings(policy(rules=rules, validations=[{"expression": expression}]), Catalog()) == []


def test_a_pod_rule_is_checked_as_the_pods_the_templates_of_workloads_stand_for() -> None:
    """The rule judges Deployments' templates as Pods (pod controllers): one warning, as a Pod."""
    checked = type_check(policy(rules=[PODS], validations=[
        {"expression": "object.spec.contianers.all(c, has(c.securityContext))"}]), Catalog())
    assert checked.kinds == ("v1, Kind=Pod",)
    assert [(w.field_ref, w.warning) for w in checked.warnings] == [
        ("spec.validations[0].expression",
         "v1, Kind=Pod: undefined field 'contianers' not found in struct 'PodSpec' (line 1, column 12)")]


def test_every_expression_is_checked_not_only_validations() -> None:
    checked = policy(
        rules=[PODS],
        match={"resources": [PODS], "conditions": [{"name": "c", "expression": "object.spec.nodeNmae != ''"}]},
        variables=[{"name": "images", "expression": "object.spec.containers.map(c, c.imgae)"}],
        validations=[{"expression": "variables.images.all(i, i != '')"}],
        mutations=[{"condition": "has(object.metadata.lables)", "merge": {"metadata": {"labels": {"a": "b"}}}}])
    assert [field for field, _ in warnings(checked, Catalog())] == [
        "spec.match.conditions[0].expression", "spec.variables[0].expression", "spec.mutations[0].condition"]


def test_variables_are_typed_by_their_expressions() -> None:
    checked = policy(rules=[PODS], variables=[{"name": "first", "expression": "object.spec.containers[0]"}],
                     validations=[{"expression": "variables.first.imag != ''"}])
    assert warnings(checked, Catalog()) == [
        ("spec.validations[0].expression",
         "v1, Kind=Pod: undefined field 'imag' not found in struct 'Container' (line 1, column 16)")]


def test_request_and_namespace_object_are_typed() -> None:
    checked = policy(rules=[PODS], validations=[
        {"expression": "request.userInfo.username != '' && request.operaton == 'CREATE'"},
        {"expression": "namespaceObject.metadata.labels['team'] == 'a' && namespaceObject.spec.finalisers.size() > 0"}])
    found = warnings(checked, Catalog())
    assert [field for field, _ in found] == ["spec.validations[0].expression", "spec.validations[1].expression"]
    assert "'operaton'" in found[0][1] and "'finalisers'" in found[1][1]


def test_the_quantity_fields_are_those_of_kubernetes_schemas() -> None:
    """The models call a quantity a str; ``kinds._QUANTITIES`` names them all, as Kubernetes'
    own OpenAPI schemas (the newest that kubernetes-validate ships) say."""
    import kubernetes_validate
    from kubernetes_asyncio.client import models
    schemas = sorted((Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema").glob("v*-local-strict"),
                     key=lambda p: tuple(int(n) for n in p.name[1:].split("-")[0].split(".")))
    definitions = json.loads((schemas[-1] / "_definitions.json").read_text())["$defs"]
    expected: dict[str, set[str]] = {}
    for name, schema in definitions.items():
        group_version, _, kind = name.rpartition(".")
        model = group_version.rpartition(".")[2].capitalize() + kind
        for field, value in (schema.get("properties") or {}).items():
            if "resource.Quantity" in json.dumps(value) and hasattr(models, model):
                expected.setdefault(model, set()).add(field)
    assert {model: set(fields) for model, fields in _QUANTITIES.items() if hasattr(models, model)} == expected


def test_lint_prints_the_warnings_and_fails_with_strict(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(json.dumps({
        "apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": "typo"},
        "spec": {"match": {"resources": [PODS]},
                 "validations": [{"expression": "object.spec.contianers.all(c, has(c.securityContext))"}]}}))
    result = CliRunner().invoke(main, ["lint", str(path)])
    assert result.exit_code == 0, result.output
    assert (f"warn   {path}: AdmissionPolicy 'typo': spec.validations[0].expression: v1, Kind=Pod: undefined field "
            "'contianers' not found in struct 'PodSpec' (line 1, column 12)") in result.output
    assert CliRunner().invoke(main, ["lint", "--strict", str(path)]).exit_code == 2
    json_result = CliRunner().invoke(main, ["lint", "-o", "json", str(path)])
    assert json.loads(json_result.output)["policies"][0]["typeChecking"][0]["fieldRef"] == \
        "spec.validations[0].expression"


def test_lint_types_custom_kinds_by_the_crds_among_its_files(tmp_path: Path) -> None:
    (tmp_path / "crd.yaml").write_text(json.dumps(crd("example.com", "widgets", "Widget", {
        "type": "object", "properties": {"spec": {"type": "object", "properties": {"color": {"type": "string"}}}}})))
    (tmp_path / "policy.yaml").write_text(json.dumps({
        "apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": "colors"},
        "spec": {"match": {"resources": [WIDGETS]}, "validations": [{"expression": "object.spec.colour != 'red'"}]}}))
    result = CliRunner().invoke(main, ["lint", "--strict", str(tmp_path)])
    assert result.exit_code == 2 and "undefined field 'colour' not found in struct 'Widget.spec'" in result.output


def test_every_example_type_checks() -> None:
    result = CliRunner().invoke(main, ["lint", "--strict", str(Path(__file__).parents[2] / "examples")])
    assert result.exit_code == 0, result.output
