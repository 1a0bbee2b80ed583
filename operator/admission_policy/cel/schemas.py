"""OpenAPI schemas as CEL types, so that expressions can be type-checked against what they read.

Kubernetes checks a ValidatingAdmissionPolicy's expressions with ``object`` typed by the schema of
each kind it matches; cel-expr-python checks against protobuf message types. So a schema becomes
messages here, built at run time into the descriptor pool every environment shares
(``lib.types.pool``), and ``declare`` returns the CEL type of its root. Only checking uses them:
requests are still evaluated on plain values, typed ``dyn``.

Where a schema does not pin down what a request's JSON holds, the type is ``dyn``
(``google.protobuf.Value``), so the checker stays silent rather than warn about a valid
expression: int-or-string (and quantities, ``oneOf`` string or number),
``x-kubernetes-preserve-unknown-fields``, embedded resources, a schema without a type, an object
with neither properties nor a typed ``additionalProperties``, and lists of lists or maps of lists
(protobuf has no such field). Formats are not types here: a ``date-time`` is a string in the JSON
the policy reads, so it is a string to the checker too (Kubernetes' checker calls it a timestamp,
which its own runtime never hands a policy). An object whose property names are not CEL
identifiers (or are ``in``, ``true`` …) is ``dyn`` too: its fields are read by index
(``x['a-b']``), which a message refuses.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from cel_expr_python import cel
from google.protobuf import descriptor_pb2, struct_pb2

from .lib.types import pool

Schema = Mapping[str, Any]

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS: Final = {"string": _F.TYPE_STRING, "integer": _F.TYPE_INT64, "number": _F.TYPE_DOUBLE,
                   "boolean": _F.TYPE_BOOL}
_DYN: Final = ".google.protobuf.Value"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEYWORDS: Final = frozenset({"true", "false", "null", "in"})   # never a field after a dot: read by index
_REF = re.compile(r"^(?:#/(?:definitions|components/schemas|\$defs)/)?(.+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


@functools.cache
def _struct_file() -> str:
    """google/protobuf/struct.proto in the shared pool (``Value`` is CEL's ``dyn``)."""
    name: str = struct_pb2.DESCRIPTOR.name
    try:
        pool().FindFileByName(name)
    except KeyError:
        pool().AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    return name


def declare(schema: Schema, definitions: Mapping[str, Schema] | None = None, name: str = "Root") -> cel.Type:
    """The CEL type of ``schema`` (OpenAPI v3, as a CRD's ``openAPIV3Schema`` or a kind's schema
    in ``/openapi/v3``), with ``$ref``s resolved in ``definitions``: ``dyn`` where the schema leaves
    the JSON open (see the module's docstring). Declared once per distinct schema; ``name`` is
    the root message's (a kind's name, for the checker's messages)."""
    root = _UNSAFE.sub("_", name) if _IDENTIFIER.match(name) else "Root"
    text = json.dumps([schema, definitions or {}, root], sort_keys=True, default=str)
    return _declare(text)


@functools.lru_cache(maxsize=512)
def _declare(text: str) -> cel.Type:
    schema, definitions, name = json.loads(text)
    package = "k8s.schema.s" + hashlib.sha256(text.encode()).hexdigest()[:20]
    file = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}.proto", package=package,
                                              syntax="proto3", dependency=[_struct_file()])
    builder = _Builder(file, package, definitions)
    root = builder.type_of(schema, name, builder.root)
    if root[1] != _F.TYPE_MESSAGE or root[0] == _DYN:
        return cel.Type.DYN
    try:
        pool().Add(file)
        pool().FindMessageTypeByName(root[0].lstrip("."))
    except (TypeError, ValueError, KeyError):   # what protobuf refuses (two fields alike in JSON …): unchecked
        return cel.Type.DYN
    return cel.Type(root[0].lstrip("."))


class _Builder:
    """Messages for one schema and the definitions it reaches, in one file. A scope is where a
    nested object's message goes: the file, or a message (with its full name)."""

    def __init__(self, file: descriptor_pb2.FileDescriptorProto, package: str,
                 definitions: Mapping[str, Schema]) -> None:
        self.file = file
        self.root = (file, f".{package}")
        self.definitions = definitions
        self.named: dict[str, tuple[str, int]] = {}   # definition → its type, once declared

    def type_of(self, schema: Any, name: str, scope: tuple[Any, str], depth: int = 0,
                map_name: str | None = None) -> tuple[str, int]:
        """(type name, protobuf type) of a field holding ``schema`` (not a list: see _field);
        a nested object becomes a message in ``scope``, named ``name``. Only a field's own type
        (``map_name`` given) may be a map: its entry comes back with the type -1, named
        ``<map_name>Entry`` as protobuf wants; a map anywhere else (a list's items, a map's
        values, a definition) is ``dyn``."""
        if not isinstance(schema, Mapping) or depth > 64:
            return _DYN, _F.TYPE_MESSAGE
        resolved = self._resolved(schema)
        if isinstance(resolved, str):
            return self._definition(resolved)
        schema = resolved
        if schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields") \
                or schema.get("x-kubernetes-embedded-resource"):
            return _DYN, _F.TYPE_MESSAGE
        kind = _type(schema)
        if kind in _SCALARS:
            return "", _SCALARS[kind]
        if kind == "object":
            return self._object(schema, name, scope, depth, map_name)
        return _DYN, _F.TYPE_MESSAGE   # an array here is a list of lists; no type: anything

    def _resolved(self, schema: Schema) -> Schema | str:
        """A ``$ref`` (alone, or the only ``allOf``) as the definition's name; else the schema."""
        ref = schema.get("$ref")
        if ref is None and isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1 \
                and isinstance(schema["allOf"][0], Mapping):
            ref = schema["allOf"][0].get("$ref")
        if not isinstance(ref, str):
            return schema
        target = _REF.match(ref)
        return target[1] if target and target[1] in self.definitions else {}

    def _definition(self, name: str) -> tuple[str, int]:
        """A definition's type, declared once at the file's top; a cycle reads its name early."""
        if name not in self.named:
            message = _UNSAFE.sub("_", name)
            self.named[name] = (f"{self.root[1]}.{message}", _F.TYPE_MESSAGE)
            self.named[name] = self.type_of(self.definitions[name], message, self.root)
        return self.named[name]

    def _object(self, schema: Schema, name: str, scope: tuple[Any, str], depth: int,
                map_name: str | None) -> tuple[str, int]:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if not properties:
            if isinstance(extra, Mapping) and map_name is not None:   # a map: key string, value typed
                return self._map(extra, map_name, scope, depth)
            return _DYN, _F.TYPE_MESSAGE
        if not isinstance(properties, Mapping) or extra not in (None, False) \
                or not all(isinstance(key, str) and _IDENTIFIER.match(key) and key not in _KEYWORDS
                           for key in properties):
            return _DYN, _F.TYPE_MESSAGE
        container, prefix = scope
        message = (container.message_type if container is self.file else container.nested_type).add(name=name)
        here = (message, f"{prefix}.{name}")
        for number, (key, value) in enumerate(properties.items(), start=1):
            field = message.field.add(name=key, number=number, label=_F.LABEL_OPTIONAL, json_name=key)
            self._field(field, value, _camel(key), here, depth)
        return here[1], _F.TYPE_MESSAGE

    def _field(self, field: Any, schema: Any, name: str, scope: tuple[Any, str], depth: int) -> None:
        """Type ``field``; its nested types are named after it (``<Name>Type``, ``<Name>Entry``)."""
        resolved = self._resolved(schema) if isinstance(schema, Mapping) else schema
        if isinstance(resolved, Mapping) and _type(resolved) == "array":
            field.label = _F.LABEL_REPEATED
            found = self.type_of(resolved.get("items"), f"{name}Type", scope, depth + 1)   # a map in it: dyn
        else:
            found = self.type_of(schema, f"{name}Type", scope, depth + 1, map_name=name)
            if found[1] == -1:   # a map is a repeated entry in protobuf
                field.label, found = _F.LABEL_REPEATED, (found[0], _F.TYPE_MESSAGE)
        field.type = found[1]
        if found[1] == _F.TYPE_MESSAGE:
            field.type_name = found[0]

    def _map(self, values: Schema, name: str, scope: tuple[Any, str], depth: int) -> tuple[str, int]:
        """A map entry message in ``scope``; a map of lists or of maps is ``dyn``."""
        resolved = self._resolved(values)
        if isinstance(resolved, Mapping) and _type(resolved) in ("array", "object") \
                and not resolved.get("properties"):
            return _DYN, _F.TYPE_MESSAGE
        container, prefix = scope
        entry = container.nested_type.add(name=f"{name}Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
        value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
        found = self.type_of(values, f"{name}Value", scope, depth + 1)
        value.type = found[1]
        if found[1] == _F.TYPE_MESSAGE:
            value.type_name = found[0]
        return f"{prefix}.{entry.name}", -1


def _camel(key: str) -> str:
    """A field's name as protobuf names its map entry (``<Camel>Entry``): ``foo_bar`` → ``FooBar``."""
    return "".join(part[:1].upper() + part[1:] for part in key.split("_"))


def _type(schema: Schema) -> str | None:
    """The schema's one type; ``["string", "null"]`` (nullable, as OpenAPI 3.1 says it) is "string"."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None
