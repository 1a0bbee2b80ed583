"""Plugins: the API, discovery through entry points, compile-time checks, bounded evaluation,
feature gates, and the two shipped plugins."""
from __future__ import annotations

import hashlib
import pathlib
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from admission_policy import features, plugins
from admission_policy.api import PolicyError, parse_policy
from admission_policy.builtin_plugins.images import parse_reference
from admission_policy.engine.compiler import PolicyCompileError
from admission_policy.plugins import Failure, MutatorPlugin, PluginRequest, ValidatorPlugin
from builders import decide, pod, policy, policy_body

PACKAGE = pathlib.Path(__file__).parents[1] / "plugin_package"
DIGEST = "sha256:" + "a" * 64


class Raises(ValidatorPlugin):
    name: ClassVar[str] = "raises"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        raise RuntimeError("boom")


class Garbage(ValidatorPlugin):
    name: ClassVar[str] = "garbage"
    stage: ClassVar[plugins.Stage] = "Beta"

    def validate(self, config: Any, request: PluginRequest) -> Any:
        return 42


class AddLabel(MutatorPlugin):
    name: ClassVar[str] = "add-label"
    stage: ClassVar[plugins.Stage] = "Alpha"
    config_schema: ClassVar[Mapping[str, Any]] = {"type": "object", "required": ["value"],
                                                   "properties": {"value": {"type": "string"}}}

    def mutate(self, config: Any, request: PluginRequest) -> Any:
        return [{"op": "add", "path": "/metadata/labels", "value": {"from-plugin": config["value"]}}]


class AddNotANumber(MutatorPlugin):
    name: ClassVar[str] = "add-not-a-number"
    stage: ClassVar[plugins.Stage] = "Beta"

    def mutate(self, config: Any, request: PluginRequest) -> Any:
        return [{"op": "add", "path": "/metadata/labels", "value": {"ratio": float("nan")}}]


@pytest.fixture
def registry() -> plugins.Registry:
    found = plugins.discover(group="admission_policy.plugins.none")
    extra = {p.name: p for p in (Raises(), Garbage(), AddLabel(), AddNotANumber())}
    return plugins.Registry({**found.plugins, **extra}, {**found.sources, **dict.fromkeys(extra, "test")})


# --- API -------------------------------------------------------------------------------------

def test_a_validation_is_cel_or_a_plugin_not_both() -> None:
    with pytest.raises(PolicyError, match=r"spec.validations\[0\]: needs exactly one of expression or plugin"):
        parse_policy(policy_body(validations=[{"expression": "true", "plugin": {"name": "x"}}]))
    with pytest.raises(PolicyError, match=r"spec.mutations\[0\].plugin.bogus: unknown field"):
        parse_policy(policy_body(mutations=[{"plugin": {"name": "x", "bogus": 1}}]))


def test_an_unknown_plugin_or_a_bad_config_is_a_compile_error_naming_the_field(registry: plugins.Registry) -> None:
    with pytest.raises(PolicyCompileError, match=r"spec.validations\[1\].plugin.name: no plugin named 'nope'"):
        policy(registry=registry, validations=[{"expression": "true"}, {"plugin": {"name": "nope"}}])
    with pytest.raises(PolicyCompileError) as caught:
        policy(registry=registry, validations=[{"plugin": {"name": "image-references",
                                                    "config": {"requireDigest": "yes"}}}])
    assert "spec.validations[0].plugin.config.requireDigest: 'yes' is not of type 'boolean'" in str(caught.value)
    with pytest.raises(PolicyCompileError, match=r"plugin.config.allowedRegistries\[1\]: 'bad host!/x'"):
        policy(registry=registry, validations=[{"plugin": {"name": "image-references", "config": {
            "allowedRegistries": ["ok.io", "bad host!/x"]}}}])
    with pytest.raises(PolicyCompileError, match="is a mutator, not a validator"):
        policy(registry=registry, validations=[{"plugin": {"name": "add-label", "config": {"value": "x"}}}])


# --- evaluation: plugins mix with CEL; their errors are the failurePolicy's ---------------------

def test_cel_and_plugin_failures_are_reported_in_order(registry: plugins.Registry) -> None:
    compiled = policy(registry=registry, validations=[
        {"expression": "object.metadata.name != 'web'", "message": "not web"},
        {"plugin": {"name": "image-references", "config": {"requireDigest": True}}}])
    decision = decide(compiled, pod())
    assert not decision.allowed
    assert "not web; spec.containers[0].image: nginx is not pinned by a digest" in decision.message
    assert [(c.plugin, c.result) for c in decision.plugin_calls] == [("image-references", "failed")]
    assert decide(compiled, {**pod(images=[f"nginx@{DIGEST}"]), "metadata": {"name": "api"}}).allowed


@pytest.mark.parametrize(("plugin", "text"), [
    ("raises", "plugin 'raises' raised RuntimeError: boom"),
    ("garbage", "plugin 'garbage' returned int, not a list of failures"),
])
def test_a_plugin_raising_or_returning_garbage_is_an_evaluation_error(
        registry: plugins.Registry, plugin: str, text: str) -> None:
    failing = decide(policy(registry=registry, validations=[{"plugin": {"name": plugin}}]), pod())
    assert not failing.allowed and text in failing.message and "spec.validations[0].plugin" in failing.message
    assert [c.result for c in failing.plugin_calls] == ["error"]
    ignored = decide(policy(registry=registry, failurePolicy="Ignore", validations=[{"plugin": {"name": plugin}}]),
                     pod())
    assert ignored.allowed and text in ignored.outcomes[0].errors[0]


def test_a_mutator_plugin_returns_a_json_patch(registry: plugins.Registry) -> None:
    compiled = policy(registry=registry, gates="AddLabelPlugin=true", mutations=[{"plugin": {"name": "add-label",
                                                                             "config": {"value": "yes"}}}])
    decision = decide(compiled, pod())
    assert decision.allowed and decision.patched_object["metadata"]["labels"] == {"from-plugin": "yes"}


def test_a_mutator_plugin_patching_in_a_value_json_cannot_carry_is_an_evaluation_error(
        registry: plugins.Registry) -> None:
    decision = decide(policy(registry=registry, mutations=[{"plugin": {"name": "add-not-a-number"}}]), pod())
    assert not decision.allowed and not decision.patch
    assert "spec.mutations[0].plugin: plugin 'add-not-a-number' returned NaN at [0].value.ratio, which is not a " \
           "JSON number" in decision.message
    assert [c.result for c in decision.plugin_calls] == ["error"]


# --- feature gates -----------------------------------------------------------------------------

def test_gates_have_stage_defaults_and_parse_kubernetes_style(registry: plugins.Registry) -> None:
    gates = features.parse("", registry)
    assert gates.enabled("ImageReferencesPlugin") and gates.enabled("TLSSecretsPlugin")   # Beta
    assert not gates.enabled("AddLabelPlugin")                                             # Alpha
    gates = features.parse(["ImageReferencesPlugin=false", "AddLabelPlugin=true"], registry)
    assert not gates.enabled("ImageReferencesPlugin") and gates.enabled("AddLabelPlugin")
    with pytest.raises(features.FeatureGateError, match="unknown feature gate 'Nope'"):
        features.parse("Nope=true", registry)
    with pytest.raises(features.FeatureGateError, match="expected Name=true"):
        features.parse("PythonPlugins", registry)


def test_a_gated_off_plugin_is_skipped_and_reported(registry: plugins.Registry) -> None:
    compiled = policy(registry=registry, gates="ImageReferencesPlugin=false", validations=[
        {"plugin": {"name": "image-references", "config": {"requireDigest": True}}}])
    assert compiled.gated_off == ("spec.validations[0].plugin: plugin 'image-references' is switched off by "
                                  "feature gate ImageReferencesPlugin=false; this rule is skipped",)
    assert decide(compiled, pod()).allowed
    assert policy(registry=registry, gates="PythonPlugins=false", mutations=[
        {"plugin": {"name": "add-label", "config": {"value": "x"}}}]).gated_off


# --- discovery: a plugin from a separately installed package -----------------------------------

@pytest.fixture
def installed(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """tests/plugin_package as pip would install it: the module and a dist-info with its entry points."""
    shutil.copytree(PACKAGE / "src" / "acme_policy_plugins", tmp_path / "acme_policy_plugins")
    info = tmp_path / "acme_policy_plugins-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-policy-plugins\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[admission_policy.plugins]\nlabel-checksum = acme_policy_plugins:LabelChecksum\n"
        "broken = acme_policy_plugins:DoesNotExist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path


def test_a_plugin_from_an_installed_package_is_discovered_and_used(installed: pathlib.Path) -> None:
    found = plugins.discover()
    assert found.sources["label-checksum"] == "acme-policy-plugins"
    assert found.sources["image-references"] == "builtin"
    assert [b.name for b in found.broken] == ["broken"] and "DoesNotExist" in found.broken[0].error
    checksum = [{"plugin": {"name": "label-checksum", "config": {"label": "app", "annotation": "acme.com/sha"}}}]
    off = policy(registry=found, validations=checksum)
    assert off.gated_off   # Alpha: off by default
    on = policy(registry=found, gates="LabelChecksumPlugin=true", validations=checksum)
    bad = pod(labels={"app": "web"}, images=[f"nginx@{DIGEST}"], metadata={"annotations": {"acme.com/sha": "0"}})
    assert "must be the sha256 of label app" in decide(on, bad).message
    good = pod(labels={"app": "web"}, images=[f"nginx@{DIGEST}"],
               metadata={"annotations": {"acme.com/sha": hashlib.sha256(b"web").hexdigest()}})
    assert decide(on, good).allowed


def test_a_policy_naming_a_plugin_that_failed_to_load_is_refused_with_its_error(installed: pathlib.Path) -> None:
    found = plugins.discover()
    with pytest.raises(PolicyCompileError, match=r"spec.validations\[0\].plugin.name: plugin 'broken' is installed "
                                                 r"\(by acme-policy-plugins\) but failed to load: AttributeError: .*"
                                                 r"DoesNotExist"):
        policy(registry=found, validations=[{"plugin": {"name": "broken"}}])


def test_the_operator_logs_each_broken_plugin_once_at_startup(installed: pathlib.Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from admission_policy.operator import lifecycle

    lifecycle._report_broken_plugins(plugins.discover())
    assert [(r.levelname, r.getMessage()) for r in caplog.records if "broken" in r.getMessage()] == [
        ("WARNING", "Plugin 'broken' (from acme-policy-plugins) failed to load and is unavailable: AttributeError: "
                    "module 'acme_policy_plugins' has no attribute 'DoesNotExist'")]


def test_the_packages_own_test_passes(installed: pathlib.Path) -> None:
    import importlib.util
    spec = importlib.util.spec_from_file_location("plugin_package_test", PACKAGE / "test_label_checksum.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_a_wrong_checksum_fails_and_a_right_one_passes()


def test_the_guides_policy_suite_runs_the_installed_plugin_with_its_gate_on(
        installed: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/writing-a-plugin.md: ``AP_FEATURE_GATES=LabelChecksumPlugin=true admission-policy test
    tests/plugin_package/policy-test`` passes; without the gate the plugin's rule is skipped."""
    from click.testing import CliRunner

    from admission_policy.cli import main

    def run(gates: str) -> int:
        monkeypatch.setenv(features.ENV, gates)
        plugins.registry.cache_clear()   # the process's plugins and gates, as a fresh process has them
        features.configure(None)
        try:
            return CliRunner().invoke(main, ["test", str(PACKAGE / "policy-test")]).exit_code
        finally:
            plugins.registry.cache_clear()
            features.configure(None)

    assert run("LabelChecksumPlugin=true") == 0
    assert run("") != 0


def test_the_guides_image_recipe_is_the_packages_dockerfile() -> None:
    guide = (PACKAGE.parents[1] / "docs" / "writing-a-plugin.md").read_text()
    assert f"```dockerfile\n{(PACKAGE / 'Dockerfile').read_text()}```" in guide


# --- the shipped plugins ------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "normalised"), [
    ("nginx", "docker.io/library/nginx:latest"),
    ("index.docker.io/bitnami/redis:7", "docker.io/bitnami/redis:7"),
    ("localhost:5000/a/b:1", "localhost:5000/a/b:1"),
    ("registry.acme.com:8443/x@" + DIGEST, "registry.acme.com:8443/x@" + DIGEST),
    ("quay.io/x/y:1.2@" + DIGEST, "quay.io/x/y:1.2@" + DIGEST),
])
def test_image_references_are_normalised(text: str, normalised: str) -> None:
    assert str(parse_reference(text)) == normalised


@pytest.mark.parametrize("text", ["", "Nginx", "nginx:bad tag", "nginx@sha256:short", "a//b"])
def test_invalid_image_references_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_reference(text)


def test_allowlist_matches_hosts_and_whole_path_components(registry: plugins.Registry) -> None:
    compiled = policy(registry=registry, validations=[{"plugin": {"name": "image-references", "config": {
        "allowedRegistries": ["docker.io/library", "registry.acme.com:8443"]}}}])
    assert decide(compiled, pod(images=["nginx", "registry.acme.com:8443/x"])).allowed
    denied = decide(compiled, pod(images=["registry.acme.com/x", "docker.io/libraryx/y",
                                          "registry.acme.com.evil:8443/x"]))
    assert denied.message.count("is not from an allowed registry") == 3


def test_failure_str() -> None:
    assert str(Failure("bad", "spec.x")) == "spec.x: bad" and str(Failure("bad")) == "bad"


def test_a_gated_off_plugin_makes_the_policy_degraded_and_says_why() -> None:
    import datetime

    from admission_policy.operator import conditions

    plugins_condition = conditions.plugins_condition(("spec.validations[0].plugin: plugin 'x' is switched off",), 1)
    compiled_ok = conditions.Condition(conditions.COMPILED, "True", "Compiled", "")
    registered = conditions.Condition(conditions.REGISTERED, "True", "Registered", "")
    observation = conditions.Observation(compiled_ok, registered, plugins=plugins_condition, reports_plugins=True)
    assert observation.phase == "Degraded"
    assert observation.ready.status == "False" and observation.ready.reason == conditions.GATED_OFF
    patch = conditions.status_patch(None, observation, 1, datetime.datetime.now(datetime.UTC))
    written = {c["type"]: c for c in patch["conditions"]}
    assert written["PluginsEnabled"]["status"] == "False" and "--feature-gates" in written["PluginsEnabled"]["message"]
    assert conditions.plugins_condition((), 0) is None
    assert conditions.plugins_condition((), 2) == conditions.Condition(
        "PluginsEnabled", "True", "Enabled", "2 plugin rule(s), all enabled")


# --- data from outside, refreshed in the background ------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_refreshed_data_is_the_last_good_fetch_and_never_silently_stale() -> None:
    answers: list[Any] = [["registry.example.com"], OSError("registry down"), ["other.example.com"]]

    def fetch() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    clock = Clock()
    allowlist = plugins.Refreshed(fetch, every=60, name="the allowlist", clock=clock)
    allowlist.start = lambda: None   # type: ignore[method-assign]  # stepped by hand here, not by its thread
    with pytest.raises(plugins.StaleData, match="the allowlist is not fetched yet"):
        allowlist.value()
    assert allowlist.refresh() and allowlist.value() == ["registry.example.com"]
    clock.now += 100
    assert not allowlist.refresh()   # failed: the last good value stays, while young enough
    assert allowlist.value() == ["registry.example.com"]
    clock.now += 100                  # 200 s old, over 3 intervals
    with pytest.raises(plugins.StaleData, match=r"last fetched 200 s ago, over its max_age of 180 s "
                                                r"\(last error: OSError: registry down\)"):
        allowlist.value()
    assert allowlist.refresh() and allowlist.value() == ["other.example.com"]


def test_refreshed_data_is_fetched_on_its_own_thread_not_the_callers() -> None:
    fetched: list[str] = []
    go = threading.Event()

    def fetch() -> str:
        go.wait(10)   # a slow registry: the reader must not wait for it
        fetched.append(threading.current_thread().name)
        return "data"

    data = plugins.Refreshed(fetch, every=3600, name="crl")
    with pytest.raises(plugins.StaleData):   # the first read starts the thread and does not wait for it
        data.value()
    go.set()
    data.refreshed.wait(10)
    assert data.value() == "data" and fetched == ["refresh crl"]
    data.stop()


class AllowedByRefreshed(ValidatorPlugin):
    name: ClassVar[str] = "refreshed-allowlist"
    stage: ClassVar[plugins.Stage] = "Beta"

    def __init__(self) -> None:
        self.allowed = plugins.Refreshed(lambda: {"nginx"}, every=3600, max_age=0.0)

    def validate(self, config: Any, request: PluginRequest) -> Sequence[str]:
        images = {c["image"] for c in request.object["spec"]["containers"]}
        return [f"{image} is not allowed" for image in sorted(images - self.allowed.value())]


def test_stale_refreshed_data_is_an_evaluation_error_naming_the_plugin(registry: plugins.Registry) -> None:
    plugin = AllowedByRefreshed()
    plugin.allowed.start = lambda: None   # type: ignore[method-assign]  # never fetched
    extended = plugins.Registry({**registry.plugins, plugin.name: plugin}, {**registry.sources, plugin.name: "test"})
    decision = decide(policy(registry=extended, validations=[{"plugin": {"name": plugin.name}}]), pod())
    assert not decision.allowed
    assert "plugin 'refreshed-allowlist' raised StaleData: " in decision.message
    assert "is not fetched yet" in decision.message
