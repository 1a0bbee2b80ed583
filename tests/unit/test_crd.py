"""The CRD's structural schema holds exactly the fields the parser accepts."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from admission_policy.api import ACCEPTED_FIELDS, API_VERSION, GROUP, KIND, PLURAL

CRD = Path(__file__).parents[2] / "crds" / "admissionpolicy.yaml"


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
                       ("Violations", ".status.audit.violations"), ("Age", ".metadata.creationTimestamp")]


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
