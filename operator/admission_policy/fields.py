"""Small typed readers of a parsed YAML or JSON document, each raising a PolicyError that names
the field (``spec.validations[2].expression: must be a string, got a number``).

The AdmissionPolicy API (``api``) and the AdmissionPolicyException API (``policyexception``) read
their objects with these, so both refuse the same mistakes in the same words.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from .errors import AdmissionPolicyError


class PolicyError(AdmissionPolicyError, ValueError):
    """A policy that cannot be used, with the field path and what is wrong with it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def check_fields(raw: Mapping[str, Any], path: str, schema_path: str,
                 accepted: Mapping[str, frozenset[str]]) -> None:
    """No field but those ``accepted`` at ``schema_path`` (each kind passes its own table)."""
    unknown = sorted(set(raw) - accepted[schema_path], key=str)   # YAML keys may be numbers
    if unknown:
        key = unknown[0] if isinstance(unknown[0], str) and unknown[0] else repr(unknown[0])   # "" names nothing
        where = f"{path}.{key}" if path else key
        allowed = ", ".join(sorted(accepted[schema_path]))
        raise PolicyError(where, f"unknown field (allowed here: {allowed})")


def check_unique(names: Sequence[str], path: str, what: str, *, named: bool = True) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise PolicyError(f"{path}[{i}].name" if named else f"{path}[{i}]",
                              f"duplicate {what} name {name!r}" if named else f"duplicate {what} {name!r}")
        seen.add(name)


def mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(path, f"must be an object, got {type_name(value)}")
    return value


def array(value: Any, path: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise PolicyError(path, f"must be a list, got {type_name(value)}")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(path, f"must be true or false, got {type_name(value)}")
    return value


def string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise PolicyError(path, f"must be a string, got {type_name(value)}")
    return value


def strings(value: Any, path: str) -> list[str]:
    return [string(item, f"{path}[{i}]") for i, item in enumerate(array(value, path))]


def enum(value: Any, path: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        choices = " | ".join(allowed)
        raise PolicyError(path, f"must be one of {choices}, got {value!r}")
    return cast(str, value)


def required_string(value: Any, path: str) -> str:
    text = string(value, path)
    if not text:
        raise PolicyError(path, "must not be empty")
    return text


def type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)
