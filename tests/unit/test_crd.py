"""The CRDs' structural schemas hold exactly the fields the parsers accept."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from admission_policy import api, policyexception
from admission_policy.api import ACCEPTED_FIELDS, API_VERSION, GROUP, KIND, PLURAL

ROOT = Path(__file__).parents[2]
CRD = ROOT / "crds" / "admissionpolicy.yaml"
EXCEPTION_CRD = ROOT / "crds" / "admissionpolicyexception.yaml"
EXAMPLE_EXCEPTIONS = ROOT / "examples" / "policy-exception" / "exceptions.yaml"


def schema_objects(schema: dict[str, Any], path: str = "") -> dict[str, frozenset[str]]:
    """Schema path → property names, for every object that declares properties."""
    found: dict[str, frozenset[str]] = {}
    if "properties" in schema:
        found[path] = frozenset(schema["properties"])
        for name, child in schema["properties"].items():
            found.update(schema_objects(child, f"{path}.{name}" if path else name))
    if "items" in schema:
        found.update(schema_objects(schema["items"], f"{path}[]"))
    return found


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text())


def test_crd_schema_and_parser_accept_the_same_fields() -> None:
    version = load_crd()["spec"]["versions"][0]
    found = schema_objects(version["schema"]["openAPIV3Schema"])
    found[""] = found[""] - {"metadata"} | {"metadata"}  # metadata is the API server's, not ours
    found = {path: fields for path, fields in found.items() if not path.startswith("metadata")}
    assert found == dict(ACCEPTED_FIELDS)


def test_crd_names_and_printer_columns() -> None:
    crd = load_crd()
    assert crd["spec"]["group"] == GROUP and crd["spec"]["scope"] == "Cluster"
    names = crd["spec"]["names"]
    assert names["kind"] == KIND and names["plural"] == PLURAL
    assert set(names["shortNames"]) == {"ap", "admpol"}
    (version,) = crd["spec"]["versions"]
    assert f"{GROUP}/{version['name']}" == API_VERSION
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"].title(), c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [("Enforcement", ".spec.enforcement"), ("Phase", ".status.phase"),
                       ("Enforced-By", ".status.native.enforcedBy"), ("Violations", ".status.audit.violations"),
                       ("Age", ".metadata.creationTimestamp")]


def test_crd_enums_match_the_parser() -> None:
    from admission_policy import api
    spec = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert tuple(spec["enforcement"]["enum"]) == api.ENFORCEMENTS
    assert tuple(spec["failurePolicy"]["enum"]) == api.FAILURE_POLICIES
    mutation = spec["mutations"]["items"]["properties"]
    assert tuple(mutation["mergeMode"]["enum"]) == api.MERGE_MODES
    assert tuple(mutation["jsonPatch"]["items"]["properties"]["op"]["enum"]) == api.PATCH_OPS
    reason = spec["validations"]["items"]["properties"]["reason"]["enum"]
    assert tuple(reason) == tuple(api.REASON_CODES)


# --- AdmissionPolicyException ------------------------------------------------------------------------------

def exception_schema() -> dict[str, Any]:
    (version,) = yaml.safe_load(EXCEPTION_CRD.read_text())["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_exception_crd_spec_and_parser_accept_the_same_fields() -> None:
    found = schema_objects(exception_schema())
    spec = {path: fields for path, fields in found.items() if path.startswith("spec")}
    # Resource rules, the object selector and the conditions are parsed as a policy's are.
    shared = {
        "spec.match.resources[]": ACCEPTED_FIELDS["spec.match.resources[]"],
        "spec.match.objectSelector": ACCEPTED_FIELDS["spec.match.objectSelector"],
        "spec.match.objectSelector.matchExpressions[]": ACCEPTED_FIELDS["spec.match.objectSelector.matchExpressions[]"],
        "spec.conditions[]": ACCEPTED_FIELDS["spec.match.conditions[]"],
    }
    own = {path: fields for path, fields in policyexception.ACCEPTED_FIELDS.items() if path.startswith("spec")}
    assert spec == own | shared
    assert found[""] == policyexception.ACCEPTED_FIELDS[""]


def test_exception_crd_refuses_unknown_fields_in_spec() -> None:
    """A structural schema with nothing preserved: a misspelt field is refused, not ignored."""
    def preserved(schema: dict[str, Any]) -> bool:
        children = [*schema.get("properties", {}).values(), *([schema["items"]] if "items" in schema else [])]
        return bool(schema.get("x-kubernetes-preserve-unknown-fields")) or any(preserved(c) for c in children)
    assert not preserved(exception_schema())


def test_exception_crd_accepts_the_example_exceptions() -> None:
    docs = [doc for doc in yaml.safe_load_all(EXAMPLE_EXCEPTIONS.read_text()) if doc]
    assert docs and all(doc["kind"] == policyexception.KIND for doc in docs)
    for doc in docs:
        jsonschema.validate(doc, exception_schema())
        policyexception.parse_exception(doc)   # and the parser agrees


def refused_fields(schema: dict[str, Any], doc: dict[str, Any]) -> set[str]:
    """The field paths ("spec.policies[0].name") a schema refuses in ``doc``, a missing one included."""
    found = set()
    for error in jsonschema.Draft7Validator(schema).iter_errors(doc):
        path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
        if error.validator == "required":
            found |= {f"{path}.{name}" for name in error.validator_value if name not in error.instance}
        else:
            found.add(path)
    return {path.lstrip(".") for path in found}


@pytest.mark.parametrize(("change", "refused"), [
    ({"policies": []}, "spec.policies"),
    ({"policies": [{"rules": ["privileged"]}]}, "spec.policies[0].name"),
    ({"reason": None}, "spec.reason"),
    ({"reason": ""}, "spec.reason"),
    ({"expiresAt": None}, "spec.expiresAt"),
])
def test_exception_crd_refuses_what_the_parser_refuses(change: dict[str, Any], refused: str) -> None:
    doc = next(d for d in yaml.safe_load_all(EXAMPLE_EXCEPTIONS.read_text()) if d)
    doc["spec"] = {key: value for key, value in {**doc["spec"], **change}.items() if value is not None}
    assert refused_fields(exception_schema(), doc) == {refused}
    with pytest.raises(api.PolicyError) as caught:
        policyexception.parse_exception(doc)
    assert caught.value.path == refused


def test_exception_crd_names_and_printer_columns() -> None:
    crd = yaml.safe_load(EXCEPTION_CRD.read_text())
    assert crd["metadata"]["name"] == f"{policyexception.PLURAL}.{GROUP}"
    assert crd["spec"]["group"] == GROUP and crd["spec"]["scope"] == "Namespaced"
    names = crd["spec"]["names"]
    assert names["kind"] == policyexception.KIND and names["plural"] == policyexception.PLURAL
    assert names["listKind"] == "AdmissionPolicyExceptionList" and names["singular"] == "admissionpolicyexception"
    assert names["shortNames"] == ["ape"]
    (version,) = crd["spec"]["versions"]
    assert f"{GROUP}/{version['name']}" == policyexception.API_VERSION
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"], c["type"]) for c in version["additionalPrinterColumns"]]
    # EXPIRES is a string: kubectl prints a date in the future as <invalid>.
    assert columns == [("POLICIES", ".status.policies", "string"), ("EXPIRES", ".spec.expiresAt", "string"),
                       ("APPROVED", ".status.approvedBy", "string"), ("STATE", ".status.state", "string"),
                       ("AGE", ".metadata.creationTimestamp", "date")]


# --- NamespacedAdmissionPolicy ----------------------------------------------------------------------------

TENANT_CRD = ROOT / "crds" / "namespacedadmissionpolicy.yaml"


def test_tenant_policy_crd_has_the_admission_policy_spec_and_columns() -> None:
    """One spec for both kinds: a field added to AdmissionPolicy alone would be refused (or, by a
    client that does not ask for strict validation, pruned) in tenant policies by the API server.
    What a tenant may not use, the operator refuses at apply."""
    tenant, cluster = yaml.safe_load(TENANT_CRD.read_text()), load_crd()
    (version,) = tenant["spec"]["versions"]
    (cluster_version,) = cluster["spec"]["versions"]
    # The schema, the printer columns (`kubectl get nap` as `kubectl get ap`), the status subresource.
    assert version == cluster_version


def test_tenant_policy_crd_names_and_scope() -> None:
    crd = yaml.safe_load(TENANT_CRD.read_text())
    assert crd["metadata"]["name"] == f"namespacedadmissionpolicies.{GROUP}"
    assert crd["spec"]["group"] == GROUP and crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {"kind": "NamespacedAdmissionPolicy", "listKind": "NamespacedAdmissionPolicyList",
                                    "plural": "namespacedadmissionpolicies", "singular": "namespacedadmissionpolicy",
                                    "shortNames": ["nap"]}
