"""Plugins cannot hurt the server (issue 16's audit): a plugin that loops or blocks is answered
for when its budget runs out, one that edits its inputs changes nothing anyone else sees, and
one that returns what JSON cannot carry, exits or returns empty failures is an evaluation error
of its own policy, naming it."""
from __future__ import annotations

import copy
import datetime
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pytest

import builders
from admission_policy import plugins
from admission_policy.engine import StaticInputs, build_response
from admission_policy.engine.plugincalls import WORKERS, PluginFault, Workers
from admission_policy.plugins import Failure, MutatorPlugin, PluginRequest, ValidatorPlugin
from builders import decide, pod, policy

WAIT = 10.0   # how long a test plugin blocks at most: never reached unless the engine waits for it


class Blocks(ValidatorPlugin):
    """Blocks in C, where nothing can stop it, until the test lets it go."""
    name: ClassVar[str] = "blocks"
    stage: ClassVar[plugins.Stage] = "Beta"
    time_budget: ClassVar[float] = 0.01

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        self.release.wait(WAIT)
        self.returned.set()
        return []


class BlocksPastTheDeadline(Blocks):
    name: ClassVar[str] = "blocks-past-the-deadline"
    time_budget: ClassVar[float] = 60.0


class Loops(ValidatorPlugin):
    """Loops in Python, swallowing every Exception, until it runs out of ``WAIT``."""
    name: ClassVar[str] = "loops"
    stage: ClassVar[plugins.Stage] = "Beta"
    time_budget: ClassVar[float] = 0.01

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.ran_out = False

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        try:
            end, turns = time.monotonic() + WAIT, 0
            while time.monotonic() < end:
                try:
                    turns += 1
                except Exception:   # a broad except: the engine's stop is no Exception
                    turns = 0
            self.ran_out = True
            return []
        finally:
            self.ended.set()


class Exits(ValidatorPlugin):
    name: ClassVar[str] = "exits"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        sys.exit(3)


class Interrupted(ValidatorPlugin):
    name: ClassVar[str] = "interrupted"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        raise KeyboardInterrupt


class Returns(ValidatorPlugin):
    """Returns its config's ``failures``, made into Failure objects where they are lists."""
    name: ClassVar[str] = "returns"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Any:
        return [Failure(*failure) if isinstance(failure, list) else failure for failure in config["failures"]]


class Vandal(ValidatorPlugin):
    """Changes everything it is given, and passes."""
    name: ClassVar[str] = "vandal"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        request.object["metadata"]["name"] = "changed"
        request.object["spec"]["containers"].append({"name": "evil", "image": "evil"})
        request.request["userInfo"]["username"] = "root"
        assert request.namespace_object is not None and request.params is not None
        request.namespace_object["metadata"]["labels"]["team"] = "changed"
        request.params["data"]["limit"] = "changed"
        request.context["pods"][0]["metadata"]["name"] = "changed"
        return []


class Mutates(MutatorPlugin):
    """Returns what the test sets in ``answer`` (a function of the request's object)."""
    name: ClassVar[str] = "mutates"
    stage: ClassVar[plugins.Stage] = "Beta"

    def __init__(self) -> None:
        self.answer: Any = lambda obj: None

    def mutate(self, config: Any, request: PluginRequest) -> Any:
        return self.answer(request.object)


@pytest.fixture
def registry() -> Iterator[plugins.Registry]:
    extra: list[plugins.Plugin] = [Blocks(), BlocksPastTheDeadline(), Loops(), Exits(), Interrupted(), Returns(),
                                   Vandal(), Mutates()]
    found = plugins.discover(group="admission_policy.plugins.none")
    yield plugins.Registry({**found.plugins, **{p.name: p for p in extra}},
                           {**found.sources, **{p.name: "test" for p in extra}})
    for plugin in extra:   # let the blocked ones go, and wait until the engine has them back
        if isinstance(plugin, Blocks):
            plugin.release.set()
    for _ in range(1_000):
        if not {p.name for p in extra} & set(WORKERS.overrunning()):
            break
        time.sleep(0.01)


def validated_by(registry: plugins.Registry, name: str, **config: Any) -> Any:
    return policy(registry=registry, validations=[{"plugin": {"name": name, "config": config}}])


def wait_until_back(name: str) -> None:
    for _ in range(1_000):
        if name not in WORKERS.overrunning():
            return
        time.sleep(0.01)
    raise AssertionError(f"plugin {name!r} still overruns")


# --- time: the engine answers when the budget runs out, not when the plugin returns ----------------

def test_a_blocked_plugin_is_answered_for_when_its_budget_runs_out_and_is_not_called_again_meanwhile(
        registry: plugins.Registry, caplog: pytest.LogCaptureFixture) -> None:
    blocks = registry.plugins["blocks"]
    assert isinstance(blocks, Blocks)
    checked = validated_by(registry, "blocks")
    denied = decide(checked, pod())
    assert not blocks.returned.is_set()   # answered while the plugin still runs
    assert not denied.allowed
    assert ("spec.validations[0].plugin: plugin 'blocks' did not return within its budget of 10 ms per call"
            in denied.message)
    assert [c.result for c in denied.plugin_calls] == ["error"]
    assert [r.levelname for r in caplog.records if "'blocks'" in r.getMessage()] == ["ERROR"]

    # Until it returns, its calls fail at once, on no new thread, and are not logged again.
    threads = threading.active_count()
    for _ in range(5):
        again = decide(checked, pod())
        assert "plugin 'blocks' was not called: its call of" in again.message
        assert "which did not return within its budget of 10 ms per call, is still running" in again.message
    assert threading.active_count() == threads
    assert [r.levelname for r in caplog.records if "'blocks'" in r.getMessage()] == ["ERROR"]
    ignored = policy(registry=registry, failurePolicy="Ignore", validations=[{"plugin": {"name": "blocks"}}])
    assert decide(ignored, pod()).allowed

    blocks.release.set()
    wait_until_back("blocks")
    assert decide(checked, pod()).allowed


def test_a_looping_plugin_is_stopped_even_when_it_swallows_exceptions(registry: plugins.Registry) -> None:
    loops = registry.plugins["loops"]
    assert isinstance(loops, Loops)
    denied = decide(validated_by(registry, "loops"), pod())
    assert "plugin 'loops' did not return within its budget of 10 ms per call" in denied.message
    assert loops.ended.wait(WAIT) and not loops.ran_out   # stopped, not run to its end
    wait_until_back("loops")


def test_a_plugin_still_running_at_the_requests_deadline_is_answered_for_then(registry: plugins.Registry) -> None:
    checked = validated_by(registry, "blocks-past-the-deadline")
    decision = decide(checked, pod(), deadline=time.monotonic() + 0.05)
    assert "plugin 'blocks-past-the-deadline' did not return within the request's evaluation deadline" \
        in decision.message


def test_the_threads_overrunning_plugins_hold_are_bounded() -> None:
    pool = Workers(limit=2)
    release = threading.Event()
    try:
        for name in ("a", "b"):
            with pytest.raises(PluginFault, match=f"plugin '{name}' did not return within its budget"):
                pool.call(name, lambda: release.wait(WAIT), 0.01, "its budget")
        with pytest.raises(PluginFault, match="plugin 'c' was not called: all 2 plugin workers are busy, with "
                                              "calls still running past their budgets: a, b"):
            pool.call("c", lambda: 1, 0.01, "its budget")
    finally:
        release.set()


# --- what a plugin raises -------------------------------------------------------------------------

def test_sys_exit_in_a_plugin_is_an_evaluation_error_and_keyboard_interrupt_goes_through(
        registry: plugins.Registry) -> None:
    denied = decide(validated_by(registry, "exits"), pod())
    assert not denied.allowed and "plugin 'exits' raised SystemExit: 3" in denied.message
    with pytest.raises(KeyboardInterrupt):
        decide(validated_by(registry, "interrupted"), pod())


# --- inputs: a plugin's edits reach no one else ---------------------------------------------------

def test_a_plugin_editing_its_inputs_changes_nothing_others_see(registry: plugins.Registry) -> None:
    checked = policy(registry=registry, validations=[
        {"plugin": {"name": "vandal"}},
        {"expression": "object.metadata.name == 'web' && size(object.spec.containers) == 1 && "
                       "request.userInfo.username == 'alice' && namespaceObject.metadata.labels.team == 'a' && "
                       "params.data.limit == '1' && context.pods[0].metadata.name == 'other'",
         "message": "a plugin changed what CEL sees"}],
        paramKind={"apiVersion": "v1", "kind": "ConfigMap"}, paramRef={"name": "limits"},
        context=[{"name": "pods", "group": "", "version": "v1", "resource": "pods", "scope": "RequestNamespace",
                  "maxObjects": 10}])
    params = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "limits", "namespace": "default"},
               "data": {"limit": "1"}}]
    context = {"pods": [pod("other", images=["busybox"])]}
    namespace = builders.namespace_object({"team": "a"})
    inputs = StaticInputs(params, context)
    cached = copy.deepcopy((params, context, namespace))
    request = builders.request(pod(), name="web", user_info={"username": "alice"})
    decision = decide(checked, request, namespace, inputs=inputs)
    assert decision.allowed, decision.message
    assert decision.patched_object == pod() and not decision.patch
    assert request.raw["userInfo"] == {"username": "alice"}
    assert (params, context, namespace) == cached   # the operator's caches, here the supplied inputs


def test_a_plugin_reads_copies_made_as_it_reads_them() -> None:
    from admission_policy.engine.plugincalls import IsolatedRequest

    obj, listed = {"a": [1]}, [{"n": 1}, {"n": 2}]
    request = IsolatedRequest(obj, None, {"operation": "CREATE"}, context={"l": listed})
    assert request.operation == "CREATE" and request.object == obj
    assert request.object is request.object and request.object is not obj   # one copy, the plugin's
    items = request.context["l"]
    assert len(items) == 2 and list(items) == listed and items[:1] == listed[:1]
    assert items[-1] is items[1] and items[1] is not listed[1]
    with pytest.raises(IndexError):
        items[2]


# --- results: JSON data and real failures, or an error naming the plugin ----------------------------

@pytest.mark.parametrize(("answer", "found"), [
    (lambda obj: [{"op": "add", "path": "/metadata/labels", "value": {"a": {1, 2}}}],
     "returned a set at [0].value.a, which is not JSON data"),
    (lambda obj: [{"op": "add", "path": "/metadata/labels", "value": {"a": b"x"}}],
     "returned a bytes at [0].value.a, which is not JSON data"),
    (lambda obj: [{"op": "add", "path": "/metadata/labels", "value": {"a": datetime.datetime(2024, 1, 1)}}],
     "returned a datetime at [0].value.a, which is not JSON data"),
    (lambda obj: {**obj, "metadata": {1: "x"}}, "returned an int as a key at metadata, but keys of JSON objects"),
    (lambda obj: [{"op": "add", "path": "/metadata/labels", "value": {"r": float("inf")}}],
     "returned Infinity at [0].value.r, which is not a JSON number"),
    (lambda obj: [{"path": "/metadata/labels"}],
     "returned a JSON patch whose operation [0] has op None, not one of add, copy, move"),
    (lambda obj: [{"op": "add", "path": "/metadata/labels"}],
     "returned a JSON patch whose operation [0] (add) has no value"),
    (lambda obj: [{"op": "move", "path": "/a"}],
     "returned a JSON patch whose operation [0] (move) has from None, not a JSON pointer string"),
    (lambda obj: ["add"], "returned a JSON patch whose operation [0] is 'add', not an object"),
    (lambda obj: "add", "returned str, not a JSON patch"),
])
def test_a_mutator_returning_what_json_cannot_carry_is_an_evaluation_error_naming_where(
        registry: plugins.Registry, answer: Any, found: str) -> None:
    mutates = registry.plugins["mutates"]
    assert isinstance(mutates, Mutates)
    mutates.answer = answer
    denied = decide(policy(registry=registry, mutations=[{"plugin": {"name": "mutates"}}]), pod())
    assert not denied.allowed and not denied.patch
    assert f"spec.mutations[0].plugin: plugin 'mutates' {found}" in denied.message
    assert build_response(denied, "1")["response"]["status"]["code"] == 403
    ignored = decide(policy(registry=registry, failurePolicy="Ignore", mutations=[{"plugin": {"name": "mutates"}}]),
                     pod())
    assert ignored.allowed and not ignored.patch and found in ignored.outcomes[0].errors[0]
    assert [c.result for c in ignored.plugin_calls] == ["error"]


def test_what_a_mutator_returns_is_the_engines_own(registry: plugins.Registry) -> None:
    mutates = registry.plugins["mutates"]
    assert isinstance(mutates, Mutates)
    kept: dict[str, Any] = {}

    def answer(obj: Mapping[str, Any]) -> Any:
        kept.update(obj, metadata={**obj["metadata"], "labels": {"a": "b"}})
        return kept

    mutates.answer = answer
    decision = decide(policy(registry=registry, mutations=[{"plugin": {"name": "mutates"}}]), pod())
    kept["metadata"]["labels"]["a"] = "changed later"
    assert decision.allowed and decision.patched_object["metadata"]["labels"] == {"a": "b"}


@pytest.mark.parametrize(("failures", "shown"), [
    ([[None]], "a Failure with message None and field ''"),
    ([[""]], "a Failure with message '' and field ''"),
    ([["bad", 3]], "a Failure with message 'bad' and field an int"),
    (["fine", "  "], "'  ' at [1]"),
    ([7], "an int at [0]"),
])
def test_a_failure_without_a_message_is_an_evaluation_error_naming_the_plugin(
        registry: plugins.Registry, failures: list[Any], shown: str) -> None:
    denied = decide(validated_by(registry, "returns", failures=failures), pod())
    assert not denied.allowed and "spec.validations[0].plugin: plugin 'returns' returned " in denied.message
    assert shown in denied.message and "a failure is a non-empty str" in denied.message
    assert [c.result for c in denied.plugin_calls] == ["error"]


def test_failures_with_messages_are_reported(registry: plugins.Registry) -> None:
    denied = decide(validated_by(registry, "returns", failures=["plain", ["bad", "spec.x"]]), pod())
    assert "plain; spec.x: bad" in denied.message and [c.result for c in denied.plugin_calls] == ["failed"]


def test_a_plugin_reading_its_config_cannot_exit() -> None:
    class ExitsOnConfig(ValidatorPlugin):
        name: ClassVar[str] = "exits-on-config"

        def configure(self, config: Mapping[str, Any]) -> Any:
            sys.exit(1)

        def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
            return []

    config, problems = plugins.check_config(ExitsOnConfig(), {})
    assert config is None and problems == [("", "plugin 'exits-on-config' failed to read its config: SystemExit: 1")]


def test_a_plugin_exiting_as_it_loads_is_listed_broken(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint("exits", "exits_on_import:Plugin", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins.importlib.metadata, "entry_points", lambda group: [entry])
    found = plugins.discover()
    assert [(b.name, b.error) for b in found.broken] == [("exits", "SystemExit: 2")]
