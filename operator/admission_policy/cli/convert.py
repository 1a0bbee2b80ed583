"""``admission-policy convert``: ValidatingAdmissionPolicies and bindings in, AdmissionPolicies out.

The conversion is ``vap.convert``; this module reads the files and writes the YAML so that the
result reads like a policy written by hand: lists of plain values on one line, expressions of
several lines as blocks, and lines never folded.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from ..vap.convert import Conversion, convert
from .documents import documents_in, kubernetes_objects


def convert_paths(paths: Sequence[str]) -> Conversion:
    """Every object of the files and directories (multi-document YAML, Lists), converted."""
    return convert(found for root in paths for document in documents_in(root)
                   for found in kubernetes_objects(document))


class _Dumper(yaml.SafeDumper):
    """Block style for objects, flow style for lists of plain values."""


def _represent_list(dumper: yaml.SafeDumper, items: list[Any]) -> yaml.Node:
    flat = all(isinstance(item, (str, int, float, bool)) for item in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    """Several lines as a literal block; a text with single quotes double-quoted, not doubled up
    (``'!request.name.startsWith(''x'')'`` reads badly); the core group as ``""``."""
    style = "|" if "\n" in text else '"' if "'" in text or not text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def dump(policies: Iterable[dict[str, Any]]) -> str:
    """Multi-document YAML, each document starting with ``---``."""
    return yaml.dump_all(policies, Dumper=_Dumper, sort_keys=False, explicit_start=True, width=10_000,
                         allow_unicode=True)
