"""Apply one mutation's patch to a working object (in place)."""
from __future__ import annotations

import itertools
from collections.abc import Mapping, MutableMapping
from typing import Any

import jsonpatch
import jsonpointer


class PatchError(ValueError):
    pass


def apply_operation(document: dict[str, Any], operation: Mapping[str, Any]) -> None:
    """RFC 6902, except that ``add`` creates missing parents ("/spec/tolerations/-" on a pod
    without tolerations creates the list), which is what a policy author means."""
    if operation["op"] == "add":
        _create_parents(document, operation["path"])
    try:
        jsonpatch.apply_patch(document, [dict(operation)], in_place=True)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchError(f"{operation['op']} {operation['path']}: {exc}") from None
    except (TypeError, KeyError, IndexError) as exc:
        raise PatchError(f"{operation['op']} {operation['path']}: cannot apply ({exc})") from None


def _create_parents(document: dict[str, Any], path: str) -> None:
    try:
        tokens = jsonpointer.JsonPointer(path).parts
    except jsonpointer.JsonPointerException as exc:
        raise PatchError(f"add {path}: {exc}") from None
    node: Any = document
    for token, following in itertools.pairwise(tokens):
        if isinstance(node, MutableMapping):
            if node.get(token) is None:
                node[token] = [] if following == "-" or following.isdigit() else {}
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return  # let jsonpatch report the path error


def merge(target: Any, patch: Any, *, if_absent: bool) -> Any:
    """RFC 7386 merge patch; with ``if_absent`` only fields the target lacks are set."""
    if not isinstance(patch, Mapping):
        return target if if_absent and target is not None else patch
    if not isinstance(target, dict):
        if if_absent and target is not None:
            return target
        target = {}
    for key, value in patch.items():
        if value is None:
            if not if_absent:
                target.pop(key, None)
        elif key in target:
            if isinstance(value, Mapping) or not if_absent:
                target[key] = merge(target[key], value, if_absent=if_absent)
        else:
            target[key] = merge(None, value, if_absent=if_absent)
    return target
