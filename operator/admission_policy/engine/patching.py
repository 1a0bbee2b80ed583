"""Mutations as copy-on-write edits of an object, and the patch between two states of it.

An edit copies only the objects and arrays on the path it changes; everything else stays shared
with the object it started from, which is never changed. That is what makes a mutation cheap on
a large object, and what lets ``diff`` skip, by identity, every part no mutation touched.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonpatch
import jsonpointer

from ..errors import AdmissionPolicyError


class PatchError(AdmissionPolicyError, ValueError):
    """A JSON patch that does not apply to the object; the mutation fails as an evaluation error."""


def apply_operation(document: dict[str, Any], operation: Mapping[str, Any]) -> dict[str, Any]:
    """The document with one RFC 6902 operation applied (``document`` itself is left as it was),
    except that ``add`` creates missing parents ("/spec/tolerations/-" on a pod without
    tolerations creates the list), which is what a policy author means.

    An added or replacing value goes in as it is, not copied: the caller passes one that nothing
    else holds or changes (copy-on-write keeps later edits off it)."""
    op, path = operation["op"], operation["path"]
    try:
        parts = jsonpointer.JsonPointer(path).parts
        result = _detached(document, parts, create_parents=op == "add")
        if op == "move":
            result = _detached(result, jsonpointer.JsonPointer(operation.get("from", "")).parts, copy_root=False)
    except jsonpointer.JsonPointerException as exc:
        raise PatchError(f"{op} {path}: {exc}") from None
    if ((op in _EDITS and "value" in operation) or op == "remove") and _edit(result, parts, op, operation.get("value")):
        return result
    # Everything else, and every edit that cannot apply: jsonpatch's own operation and errors.
    try:
        patched = jsonpatch.apply_patch(result, [dict(operation)], in_place=True)   # a new root, for path ""
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchError(f"{op} {path}: {exc}") from None
    except (TypeError, KeyError, IndexError) as exc:
        raise PatchError(f"{op} {path}: cannot apply ({exc})") from None
    except RecursionError:   # jsonpatch deep-copies values, recursively
        raise PatchError(f"{op} {path}: the value nests too deeply to copy") from None
    if not isinstance(patched, dict):
        raise PatchError(f"{op} {path}: the object would become {type(patched).__name__}, not a JSON object")
    return patched


_EDITS = frozenset({"add", "replace"})
_INDEX = re.compile(r"0|[1-9][0-9]*")   # RFC 6901 array indices: no sign, no leading zero


def _edit(root: dict[str, Any], parts: list[str], op: str, value: Any) -> bool:
    """Apply an ``add``, ``replace`` or ``remove`` in place on ``root`` (already detached along
    the path) without jsonpatch's per-operation objects and deep copy of the value; False, with
    nothing changed, when it cannot apply (then jsonpatch reports why)."""
    if not parts:
        return False
    node: Any = root
    for token in parts[:-1]:
        if isinstance(node, dict):
            node = node.get(token)
        elif isinstance(node, list) and _INDEX.fullmatch(token) and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    last = parts[-1]
    if isinstance(node, dict):
        if op == "add":
            node[last] = value
        elif last not in node:
            return False
        elif op == "replace":
            node[last] = value
        else:
            del node[last]
        return True
    if not isinstance(node, list):
        return False
    if op == "add" and last == "-":
        node.append(value)
        return True
    if not _INDEX.fullmatch(last) or int(last) > len(node) or (op != "add" and int(last) == len(node)):
        return False
    if op == "add":
        node.insert(int(last), value)
    elif op == "replace":
        node[int(last)] = value
    else:
        del node[int(last)]
    return True


def _detached(document: dict[str, Any], parts: list[str], *, copy_root: bool = True,
              create_parents: bool = False) -> dict[str, Any]:
    """``document`` with its root and every container on the way to the parent of the pointer
    ``parts`` copied (shallowly), so that an in-place edit there changes nothing the original
    shares; missing parents are created when asked. Where the way cannot go on, jsonpatch
    reports the path."""
    root = dict(document) if copy_root else document
    node: Any = root
    for token, following in itertools.pairwise(parts):
        if isinstance(node, dict) and isinstance(node.get(token), (dict, list)):
            child = node[token] = _copy(node[token])
        elif isinstance(node, dict) and node.get(token) is None and create_parents:
            child = node[token] = [] if following == "-" or following.isdigit() else {}
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node) \
                and isinstance(node[int(token)], (dict, list)):
            child = node[int(token)] = _copy(node[int(token)])
        else:
            break
        node = child
    return root


def _copy(container: dict[str, Any] | list[Any]) -> dict[str, Any] | list[Any]:
    return dict(container) if isinstance(container, dict) else list(container)


def clone(value: Any) -> Any:
    """A deep copy of JSON data: faster than copy.deepcopy, which tracks shared references."""
    if isinstance(value, dict):
        return {key: clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clone(item) for item in value]
    return value


def merge(target: Any, patch: Any, *, if_absent: bool) -> Any:
    """RFC 7386 merge patch; with ``if_absent`` only fields the target lacks are set. Returns the
    merged value; ``target`` is left as it was, and the result shares what the patch leaves alone.
    It recurses as deep as the policy's patch nests (which parsed, so Python can go that deep)."""
    try:
        return _merge(target, patch, if_absent=if_absent)
    except RecursionError:
        raise PatchError("the merge patch nests too deeply") from None


def _merge(target: Any, patch: Any, *, if_absent: bool) -> Any:
    if not isinstance(patch, Mapping):
        return target if if_absent and target is not None else patch
    if not isinstance(target, dict):
        if if_absent and target is not None:
            return target
        target = {}
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            if not if_absent:
                merged.pop(key, None)
        elif key in merged:
            if isinstance(value, Mapping) or not if_absent:
                merged[key] = _merge(merged[key], value, if_absent=if_absent)
        else:
            merged[key] = _merge(None, value, if_absent=if_absent)
    return merged


def diff(old: Any, new: Any) -> list[dict[str, Any]]:
    """The RFC 6902 patch from ``old`` to ``new``.

    jsonpatch's own diff serialises every member it compares; a copy-on-write mutation leaves
    all but the path it changed the very same objects, so here those are skipped by identity.
    Objects are compared key by key; arrays item by item once their common ends are set aside,
    so an item added or removed anywhere is one operation (a reordering is several). Iterative,
    like ``json_equal``: an object may nest as deep as the API server allows (10,000 levels).
    """
    operations: list[dict[str, Any]] = []
    # (old, new, path) to compare, or a finished operation; popped last first, so pushed reversed.
    stack: list[tuple[Any, Any, str] | dict[str, Any]] = [(old, new, "")]
    while stack:
        top = stack.pop()
        if isinstance(top, dict):
            operations.append(top)
            continue
        before, after, path = top
        if before is not after:
            stack.extend(reversed(list(_differences(before, after, path))))
    return operations


def _differences(old: Any, new: Any, path: str) -> Iterator[tuple[Any, Any, str] | dict[str, Any]]:
    """One level of the diff: operations, and pairs to compare further, in patch order."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                yield {"op": "remove", "path": f"{path}/{jsonpointer.escape(key)}"}
        for key, value in new.items():
            where = f"{path}/{jsonpointer.escape(key)}"
            if key in old:
                yield old[key], value, where
            else:
                yield {"op": "add", "path": where, "value": value}
    elif isinstance(old, list) and isinstance(new, list):
        yield from _diff_lists(old, new, path)
    elif type(old) is not type(new) or old != new:   # json_equal, for what is not two objects or two arrays
        yield {"op": "replace", "path": path, "value": new}


def _diff_lists(old: list[Any], new: list[Any], path: str) -> Iterator[tuple[Any, Any, str] | dict[str, Any]]:
    shorter = min(len(old), len(new))
    start = 0
    while start < shorter and json_equal(old[start], new[start]):
        start += 1
    end = 0
    while end < shorter - start and json_equal(old[-1 - end], new[-1 - end]):
        end += 1
    old, new = old[start:len(old) - end], new[start:len(new) - end]
    paired = min(len(old), len(new))
    for index in range(paired):
        yield old[index], new[index], f"{path}/{start + index}"
    for index in range(paired, len(new)):
        yield {"op": "add", "path": f"{path}/{start + index}", "value": new[index]}
    for index in reversed(range(paired, len(old))):
        yield {"op": "remove", "path": f"{path}/{start + index}"}


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values (Python's == takes true for 1); iterative, for any depth."""
    pending = [(a, b)]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            if a.keys() != b.keys():
                return False
            pending.extend((value, b[key]) for key, value in a.items())
        elif isinstance(a, list):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif a != b:
            return False
    return True
