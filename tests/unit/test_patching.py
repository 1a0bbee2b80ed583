"""Mutations as copy-on-write edits, and the patch the response carries (engine/patching.py).

The API server applies the response's patch to the object it sent: whatever ``diff`` returns must
turn the original into exactly the mutated object, and no edit may change the object it started
from (the request's, which later policies and the patch are computed against).
"""
from __future__ import annotations

import copy
import json
import random
from typing import Any

import jsonpatch
import pytest

from admission_policy.engine.patching import PatchError, apply_operation, diff, json_equal, merge


def as_json(value: Any) -> str:
    """JSON text, so that 1 and true (equal in Python) differ."""
    return json.dumps(value, sort_keys=True)


# --- diff: random documents and edits ---------------------------------------------------------------------

KEYS = ["a", "b", "c", "x/y", "t~1", ""]


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["dict", "list", "scalar"] if depth else ["scalar"])
    if kind == "dict":
        return {key: random_value(rng, depth - 1) for key in rng.sample(KEYS, rng.randint(0, 4))}
    if kind == "list":
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 5))]
    return rng.choice([0, 1, 1.5, True, False, None, "", "s", "1"])


def random_edit(rng: random.Random, value: Any, depth: int = 3) -> Any:
    """``value`` with one change somewhere, copying only the containers on the way (as a mutation
    does), so the result shares everything else with ``value``."""
    if isinstance(value, dict) and value and rng.random() < 0.6:
        key = rng.choice(list(value))
        return {**value, key: random_edit(rng, value[key], depth)}
    if isinstance(value, list) and value and rng.random() < 0.5:
        index = rng.randrange(len(value))
        return [*value[:index], random_edit(rng, value[index], depth), *value[index + 1:]]
    if isinstance(value, dict):
        edited = dict(value)
        if edited and rng.random() < 0.4:
            del edited[rng.choice(list(edited))]
        else:
            edited[rng.choice(KEYS)] = random_value(rng, depth)
        return edited
    if isinstance(value, list):
        edited = list(value)
        choice = rng.random()
        if edited and choice < 0.3:
            del edited[rng.randrange(len(edited))]
        elif edited and choice < 0.5:
            edited.insert(rng.randrange(len(edited)), edited[rng.randrange(len(edited))])   # a repeat
        else:
            edited.insert(rng.randint(0, len(edited)), random_value(rng, depth))
        return edited
    return random_value(rng, depth)


def test_the_patch_turns_the_original_into_the_edited_value() -> None:
    for seed in range(600):
        rng = random.Random(seed)
        old = {"root": random_value(rng, 4)}
        snapshot = as_json(old)
        new = old
        for _ in range(rng.randint(1, 4)):
            new = random_edit(rng, new)
        # Shared structure (the copy-on-write case) and none at all (values CEL computed afresh).
        for target in (new, copy.deepcopy(new)):
            patch = diff(old, target)
            assert as_json(jsonpatch.apply_patch(old, patch)) == as_json(target), (seed, patch)
        assert as_json(old) == snapshot, seed


def test_an_item_added_or_removed_anywhere_in_an_array_is_one_operation() -> None:
    a, b, c = {"name": "a"}, {"name": "b"}, {"name": "c"}
    assert diff({"l": [a, b, c]}, {"l": [a, {"name": "x"}, b, c]}) == [
        {"op": "add", "path": "/l/1", "value": {"name": "x"}}]
    assert diff({"l": [a, b, c]}, {"l": [a, c]}) == [{"op": "remove", "path": "/l/1"}]
    assert diff({"l": [a, b]}, {"l": [copy.deepcopy(a), copy.deepcopy(b), c]}) == [
        {"op": "add", "path": "/l/2", "value": c}]


def test_true_is_not_1_and_keys_are_escaped() -> None:
    assert not json_equal(1, True) and not json_equal([0], [False]) and json_equal({"a": [1]}, {"a": [1]})
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff({}, {"a/b~c": 1}) == [{"op": "add", "path": "/a~1b~0c", "value": 1}]
    assert diff({"a": 1}, {}) == [{"op": "remove", "path": "/a"}]
    assert diff({"a": {"b": [1]}}, {"a": {"b": [1]}}) == []


# --- edits never change what they start from ---------------------------------------------------------------

def document() -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "web"}, "annotations": {"x/y": "1"}},
            "spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "1"}]}],
                     "volumes": [{"name": "v"}]}}


@pytest.mark.parametrize("operation, check", [
    ({"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "B"}},
     lambda d: d["spec"]["containers"][0]["env"][1] == {"name": "B"}),
    ({"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k"}},
     lambda d: d["spec"]["tolerations"] == [{"key": "k"}]),
    ({"op": "remove", "path": "/metadata/annotations/x~1y"},
     lambda d: d["metadata"]["annotations"] == {}),
    ({"op": "replace", "path": "/spec/containers/0/name", "value": "main"},
     lambda d: d["spec"]["containers"][0]["name"] == "main"),
    ({"op": "move", "from": "/spec/volumes/0", "path": "/spec/containers/0/volume"},
     lambda d: d["spec"]["volumes"] == [] and d["spec"]["containers"][0]["volume"] == {"name": "v"}),
    ({"op": "copy", "from": "/metadata/labels", "path": "/spec/containers/0/labels"},
     lambda d: d["spec"]["containers"][0]["labels"] == {"app": "web"}),
    ({"op": "test", "path": "/metadata/labels/app", "value": "web"}, lambda d: d == document()),
    ({"op": "add", "path": "/spec/volumes/1", "value": {"name": "w"}},          # at the end: an index may be the length
     lambda d: d["spec"]["volumes"] == [{"name": "v"}, {"name": "w"}]),
    ({"op": "add", "path": "/spec/volumes/0", "value": {"name": "w"}},
     lambda d: d["spec"]["volumes"] == [{"name": "w"}, {"name": "v"}]),
    ({"op": "add", "path": "/metadata/labels/-", "value": "x"},                 # in an object, "-" is a name
     lambda d: d["metadata"]["labels"] == {"app": "web", "-": "x"}),
    ({"op": "replace", "path": "/spec/volumes/0", "value": {"name": "w"}},
     lambda d: d["spec"]["volumes"] == [{"name": "w"}]),
    ({"op": "remove", "path": "/spec/containers/0/env/0"},
     lambda d: d["spec"]["containers"][0]["env"] == []),
    ({"op": "add", "path": "", "value": {"kind": "Pod"}}, lambda d: d == {"kind": "Pod"}),   # the whole document
])
def test_an_operation_returns_the_edited_document_and_leaves_its_input_as_it_was(
        operation: dict[str, Any], check: Any) -> None:
    original = document()
    edited = apply_operation(original, operation)
    assert check(edited)
    assert original == document()
    assert as_json(jsonpatch.apply_patch(document(), diff(original, edited))) == as_json(edited)


@pytest.mark.parametrize("operation", [
    {"op": "remove", "path": "/spec/containers/5"},
    {"op": "replace", "path": "/metadata/missing/x", "value": 1},
    {"op": "test", "path": "/metadata/labels/app", "value": "db"},
    {"op": "move", "from": "/spec/missing", "path": "/spec/x"},
    {"op": "replace", "path": "/spec/volumes/1", "value": {}},          # one past the end: nothing to replace
    {"op": "add", "path": "/spec/volumes/2", "value": {}},              # beyond the end
    {"op": "add", "path": "/spec/volumes/01", "value": {}},             # not an RFC 6901 index
    {"op": "remove", "path": "/metadata/labels/missing"},
    {"op": "replace", "path": "/spec/volumes/-", "value": {}},
    {"op": "add", "path": "/metadata/labels/app/x", "value": 1},        # inside a string
    {"op": "replace", "path": "", "value": [1]},                        # the object would be no object
])
def test_a_failing_operation_is_a_patch_error_and_changes_nothing(operation: dict[str, Any]) -> None:
    original = document()
    with pytest.raises(PatchError, match=operation["op"]):
        apply_operation(original, operation)
    assert original == document()


def test_merge_returns_a_new_value_and_leaves_the_target_as_it_was() -> None:
    original = document()
    merged = merge(original, {"metadata": {"labels": {"tier": "web", "app": None}}, "spec": {"x": 1}},
                   if_absent=False)
    assert merged["metadata"]["labels"] == {"tier": "web"} and merged["spec"]["x"] == 1
    assert merged["spec"]["containers"] is original["spec"]["containers"]   # untouched parts are shared
    assert original == document()
