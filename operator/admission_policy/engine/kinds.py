"""The kinds a policy's rules name, and their schemas: what ``typecheck`` types ``object`` with.

Built-in kinds come from kubernetes_asyncio, a dependency already: its models (``openapi_types``,
``attribute_map``) are the OpenAPI definitions they were generated from, and its API modules say
which resource lists which model. Two things the models lose are put back: a quantity is a
``str`` there but a string or a number in a request (``_QUANTITIES``), and int-or-string is
``object`` there (``dyn`` here, as in Kubernetes). The schemas are those of the Kubernetes version
kubernetes_asyncio tracks: a field added since the cluster's version is not flagged.

Custom resources come from their CustomResourceDefinitions' ``openAPIV3Schema``: in the cluster
the operator reads them, offline ``lint`` takes the CRDs found among its files.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from cel_expr_python import cel
from kubernetes_asyncio.client import api as client_api
from kubernetes_asyncio.client import models

from ..cel import schemas

# Fields holding a resource.Quantity (a string or a number in JSON), by model: the models type
# them ``str``. tests/unit/test_typecheck.py checks this against Kubernetes' own OpenAPI schemas.
_QUANTITIES: Final[Mapping[str, frozenset[str]]] = {model: frozenset(fields.split()) for model, fields in {
    "V1ContainerStatus": "allocatedResources",
    "V1CSIStorageCapacity": "capacity maximumVolumeSize",
    "V1EmptyDirVolumeSource": "sizeLimit",
    "V1LimitRangeItem": "default defaultRequest max maxLimitRequestRatio min",
    "V1NodeStatus": "allocatable capacity",
    "V1Overhead": "podFixed",
    "V1PersistentVolumeClaimStatus": "allocatedResources capacity",
    "V1PersistentVolumeSpec": "capacity",
    "V1PodSpec": "overhead",
    "V1PodStatus": "allocatedResources",
    "V1ResourceFieldSelector": "divisor",
    "V1ResourceQuotaSpec": "hard",
    "V1ResourceQuotaStatus": "hard used",
    "V1ResourceRequirements": "limits requests",
    "V1VolumeResourceRequirements": "limits requests",
    "V2HPAScalingRules": "tolerance",
    "V2MetricTarget": "averageValue value",
    "V2MetricValueStatus": "averageValue value",
    "V1NodeAllocatableMappedResources": "quantity",
    "V1NodeAllocatableOverheadResources": "perContainer perPod",
    **{f"{version}{model}": fields for version in ("V1", "V1beta1", "V1beta2") for model, fields in {
        "CapacityRequestPolicy": "default validValues",
        "CapacityRequestPolicyRange": "max min step",
        "CapacityRequirements": "requests",
        "Counter": "value",
        "DeviceCapacity": "value",
        "DeviceRequestAllocationResult": "consumedCapacity",
        "NodeAllocatableMapping": "capacityMultiplier deviceMultiplier",
        "NodeAllocatableOverhead": "perContainer perPod",
    }.items()},
    "V1alpha3ShareableCapacityStatus": "available consumed total",
}.items()}

_INT_OR_STRING: Final = {"x-kubernetes-int-or-string": True}
_SCALARS: Final = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
                   "datetime": "string", "date": "string", "bytearray": "string"}
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(str, (.+)\)$")
_MODEL_KIND = re.compile(r"^(?:[A-Z][a-z]+)*?V\d+(?:(?:alpha|beta)\d+)?([A-Z]\w*)$")


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind at a version, with its schema (OpenAPI v3, ``$ref``s into ``definitions``)."""
    group: str
    version: str
    kind: str
    schema: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)
    definitions: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict, compare=False,
                                                                     repr=False)

    def __str__(self) -> str:
        """As Kubernetes prints a GroupVersionKind: ``apps/v1, Kind=Deployment``."""
        return f"{self.group}/{self.version}, Kind={self.kind}" if self.group else f"{self.version}, Kind={self.kind}"

    def cel_type(self) -> cel.Type:
        return schemas.declare(self.schema, self.definitions, self.kind)


class Catalog:
    """Kinds by resource and by name: the built-in ones, and the CustomResourceDefinitions given."""

    def __init__(self, crds: Iterable[Mapping[str, Any]] = ()) -> None:
        self._by_resource: dict[tuple[str, str, str], Kind] = {}
        self._by_kind: dict[tuple[str, str, str], Kind] = {}
        for crd in crds:
            self._add_crd(crd)

    def for_resource(self, group: str, version: str, resource: str) -> Kind | None:
        found = self._by_resource.get((group, version, resource))
        if found is not None:
            return found
        model = _builtin_resources().get((group, version, resource))
        return _builtin_kind(group, version, model) if model is not None else None

    def for_kind(self, group: str, version: str, kind: str) -> Kind | None:
        found = self._by_kind.get((group, version, kind))
        if found is not None:
            return found
        model = next((m for (g, v, _), m in _builtin_resources().items()
                      if (g, v) == (group, version) and kind_name(m) == kind), None)
        return _builtin_kind(group, version, model) if model is not None else None

    def _add_crd(self, crd: Mapping[str, Any]) -> None:
        spec = crd.get("spec") if isinstance(crd, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(spec.get("names"), Mapping):
            return
        group, names = str(spec.get("group", "")), spec["names"]
        for version in spec.get("versions") or ():
            if not isinstance(version, Mapping) or not version.get("served", True):
                continue
            schema = (version.get("schema") or {}).get("openAPIV3Schema") \
                if isinstance(version.get("schema"), Mapping) else None
            kind = Kind(group, str(version.get("name", "")), str(names.get("kind", "")),
                        *_with_object_metadata(schema if isinstance(schema, Mapping) else {}))
            self._by_resource[(group, kind.version, str(names.get("plural", "")))] = kind
            self._by_kind[(group, kind.version, kind.kind)] = kind


def is_crd(body: Any) -> bool:
    return isinstance(body, Mapping) and body.get("kind") == "CustomResourceDefinition" \
        and str(body.get("apiVersion", "")).startswith("apiextensions.k8s.io/")


def _with_object_metadata(schema: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Mapping[str, Any]]]:
    """A CRD's schema and its definitions: ``metadata`` is the API server's ObjectMeta whatever
    the CRD says of it (it may only name ``name`` and ``generateName``); apiVersion and kind are set."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, Mapping) \
            or schema.get("x-kubernetes-preserve-unknown-fields"):
        return schema, {}
    return ({**schema, "properties": {**properties, "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                      "metadata": {"$ref": "V1ObjectMeta"}}},
            _definitions_of("V1ObjectMeta"))


@functools.cache
def _builtin_kind(group: str, version: str, model: str) -> Kind:
    return Kind(group, version, kind_name(model), {"$ref": model}, _definitions_of(model))


def kind_name(model: str) -> str:
    """A model's kind, as users name it: ``V1Pod`` → ``Pod``, ``CoreV1Event`` → ``Event``; another
    name (a CRD's kind) as it is."""
    found = _MODEL_KIND.match(model)
    return found[1] if found else model


@functools.cache
def _definitions_of(root: str) -> Mapping[str, Mapping[str, Any]]:
    """The OpenAPI definitions of model ``root`` and of every model it reaches, by model name."""
    definitions: dict[str, Mapping[str, Any]] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in definitions:
            continue
        cls = getattr(models, name)
        quantities = _QUANTITIES.get(name, frozenset())
        properties = {}
        for attribute, kind in cls.openapi_types.items():
            key = cls.attribute_map[attribute]
            properties[key] = _property(kind, todo, quantity=key in quantities)
        definitions[name] = {"type": "object", "properties": properties}
    return definitions


def _property(kind: str, todo: list[str], quantity: bool = False) -> Mapping[str, Any]:
    """The schema of an ``openapi_types`` entry (``quantity``: its strings are quantities); a model
    is queued to be defined too."""
    listed, mapped = _LIST.match(kind), _DICT.match(kind)
    if listed:
        return {"type": "array", "items": _property(listed[1], todo, quantity)}
    if mapped:
        return {"type": "object", "additionalProperties": _property(mapped[1], todo, quantity)}
    if quantity and kind == "str":
        return _INT_OR_STRING
    if kind in _SCALARS:
        return {"type": _SCALARS[kind]}
    if kind == "object" or not hasattr(models, kind):   # int-or-string, raw extensions: anything
        return {}
    todo.append(kind)
    return {"$ref": kind}


_METHOD = re.compile(r"\n    def (list_\w+)_with_http_info\(.*?200: \"(\w+)List\""
                     r".*?call_api\(\s*'(/apis?/[^']+)', 'GET'", re.S)


@functools.cache
def _builtin_resources() -> Mapping[tuple[str, str, str], str]:
    """(group, version, resource) → model, from the list operations of kubernetes_asyncio's API
    modules (their paths and the List model each returns)."""
    found: dict[tuple[str, str, str], str] = {}
    for module in sorted(pathlib.Path(client_api.__file__).parent.glob("*_api.py")):
        for chunk in module.read_text(encoding="utf-8").split("\n    def ")[1:]:
            method = _METHOD.search("\n    def " + chunk)
            if method is None:
                continue
            _, model, path = method.groups()
            parts = re.sub(r"/namespaces/\{namespace\}", "", path).strip("/").split("/")
            if parts[0] == "api":
                parts[0] = ""   # the core group
            else:
                parts.pop(0)
            if len(parts) != 3 or "{" in parts[2] or not hasattr(models, model):
                continue
            group, version, resource = parts
            found[(group, version, resource)] = model
    return found
