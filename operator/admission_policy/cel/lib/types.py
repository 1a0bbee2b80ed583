"""Kubernetes' opaque CEL types (``net.IP``, ``kubernetes.Quantity``, …) as protobuf messages.

cel-expr-python cannot hand a Python object to CEL as a value of an abstract type ("Unimplemented
type"), but it passes protocol-buffer messages both ways. So each opaque type of Kubernetes' CEL
libraries is a message of the same full name, declared here at run time (no .proto file to
compile), holding one string: the value's canonical text. That gives what Kubernetes gives:
``type(ip('10.0.0.1'))`` is ``net.IP``; ``==`` and ``in`` compare values (the canonical text is
equal exactly when Kubernetes' ``Equal`` says so); and overloads are chosen by type at check time.

The field is an implementation detail (``ip(x).state`` reads it); the docs do not offer it.
"""
from __future__ import annotations

import copyreg
import dataclasses
import functools
from typing import Any, Final

from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# Full name → what the value's canonical text is (for the reader of this module).
NAMES: Final = {
    "net.IP": "the address as Go's netip.Addr.String() writes it",
    "net.CIDR": "the prefix as written, address and length (netip.Prefix.String())",
    "kubernetes.URL": "the URL as given",
    "kubernetes.Quantity": "the exact value, normalised (equal quantities, equal text)",
    "kubernetes.Semver": "the version as parsed, normalised",
    "kubernetes.NamedFormat": "the format's name",
    "kubernetes.authorization.Authorizer": "the request's identity (JSON)",
    "kubernetes.authorization.PathCheck": "the check's attributes (JSON)",
    "kubernetes.authorization.GroupCheck": "the check's attributes (JSON)",
    "kubernetes.authorization.ResourceCheck": "the check's attributes (JSON)",
    "kubernetes.authorization.Decision": "the decision (JSON)",
}


@dataclasses.dataclass(frozen=True)
class Opaque:
    """One opaque type: its CEL type, and how to build and read a value of it."""
    name: str
    type: cel.Type
    message: Any   # the generated message class

    def of(self, state: str) -> Any:
        """A CEL value of this type whose canonical text is ``state``: the same message for the
        same text (``_interned``), as a library function's results leak a reference."""
        return _interned(self.message, state)

    def is_value(self, value: Any) -> bool:
        """Whether a value from CEL is of this type (a ``dyn`` argument may be anything)."""
        return isinstance(value, self.message)

    @staticmethod
    def state(value: Any) -> str:
        """The canonical text a value was built from (``of``), for the library to decode."""
        return str(value.state)


# cel-expr-python 0.1.3 keeps one reference to every message a Python function returns to CEL
# (and leaks the copy it makes of every message argument it passes to one), so a message built
# per call would stay in memory for ever: ~1 KB per request for a policy comparing quantities.
# Values are immutable here, so one message per distinct text serves every call; what is leaked
# is then a reference count, and a message per distinct value, not per call.
_INTERNED_VALUES: Final = 65_536


@functools.lru_cache(maxsize=_INTERNED_VALUES)
def _interned(message: Any, state: str) -> Any:
    return message(state=state)


@functools.cache
def pool() -> descriptor_pool.DescriptorPool:
    """The descriptor pool every environment is created with (one per process)."""
    result = descriptor_pool.DescriptorPool()
    by_package: dict[str, list[str]] = {}
    for full in NAMES:
        package, _, name = full.rpartition(".")
        by_package.setdefault(package, []).append(name)
    for package, names in by_package.items():
        file = descriptor_pb2.FileDescriptorProto(
            name=f"admission_policy/{package.replace('.', '/')}.proto", package=package, syntax="proto3")
        for name in names:
            message = file.message_type.add(name=name)
            message.field.add(name="state", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                              label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        result.Add(file)
    return result


@functools.cache
def opaque(name: str) -> Opaque:
    """The opaque type of that full name (one of ``NAMES``)."""
    if name not in NAMES:
        raise KeyError(f"{name} is not one of Kubernetes' CEL types declared here")
    message = message_factory.GetMessageClass(pool().FindMessageTypeByName(name))
    # Picklable by name (the generated class is not importable): a value crosses from the child
    # process a costly policy runs in (``cel.fork``) like any other.
    copyreg.pickle(message, lambda value: (value_of, (name, str(value.state))))
    return Opaque(name, cel.Type(name), message)


def value_of(name: str, state: str) -> Any:
    """A value of the opaque type ``name`` with that canonical text."""
    return opaque(name).of(state)


def may_hold_opaque(type_: cel.Type) -> bool:
    """Whether a value of this checked type can be or hold an opaque value (``dyn`` can)."""
    name = type_.name()
    return type_.is_message() or "DYN" in name or any(full in name for full in NAMES)


_SCALARS: Final = (str, bool, int, float, bytes, type(None))


def to_plain(value: Any) -> Any:
    """A CEL result with every opaque value replaced by its canonical text (JSON can carry it).
    Every request's results pass here: a list of scalars is returned as it is, uncopied."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list):
        if all(isinstance(item, _SCALARS) for item in value):
            return value
        return [to_plain(item) for item in value]
    if isinstance(value, dict):
        return {to_plain(key): to_plain(item) for key, item in value.items()}
    if hasattr(value, "DESCRIPTOR") and value.DESCRIPTOR.full_name in NAMES:
        return str(value.state)
    return value
