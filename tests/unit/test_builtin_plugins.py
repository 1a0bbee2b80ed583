"""The shipped plugins: ``image-references`` reads images as the runtime does (the
distribution/reference grammar, strictly)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from admission_policy import api, features, plugins
from admission_policy.api import parse_policy
from admission_policy.builtin_plugins.images import ImageReferences, parse_reference
from admission_policy.engine import compile_policy
from admission_policy.engine.compiler import PolicyCompileError
from admission_policy.plugins import ConfigError, PluginRequest

HEX64 = "4c8e3a4b8b5e5f1f2a7d9c0e1b2a3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
DIGEST = f"sha256:{HEX64}"
REGISTRY = plugins.discover(group="admission_policy.plugins.none")   # the builtins only


def policy_body(resource: str, plugin: Mapping[str, Any]) -> dict[str, Any]:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": [resource], "operations": ["CREATE", "UPDATE"]}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "p"},
            "spec": {"match": {"resources": [rule]}, "failurePolicy": "Fail", "validations": [{"plugin": plugin}]}}


# --- image-references: parsing ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "normalised"), [
    ("localhost:5000/x", "localhost:5000/x:latest"),
    ("registry:5000/x:tag", "registry:5000/x:tag"),                 # a port makes a one-label host
    ("docker.io/nginx", "docker.io/library/nginx:latest"),
    ("index.docker.io/library/nginx:1.25", "docker.io/library/nginx:1.25"),
    ("bitnami/redis", "docker.io/bitnami/redis:latest"),
    (f"nginx:1.25@{DIGEST}", f"docker.io/library/nginx:1.25@{DIGEST}"),
    ("Registry.Acme.COM/shop/web", "registry.acme.com/shop/web:latest"),   # hosts are case-insensitive
    ("[::1]:5000/x:1", "[::1]:5000/x:1"),
    ("[fe80::1]/team/app", "[fe80::1]/team/app:latest"),
    (f"x.io/a@sha512:{'b' * 128}", f"x.io/a@sha512:{'b' * 128}"),
    (f"x.io/a@blake3:{HEX64}", f"x.io/a@blake3:{HEX64}"),
    ("x.io/" + "a" * 250, "x.io/" + "a" * 250 + ":latest"),          # a name of exactly 255
    ("x.io/a:_tag.1-" + "b" * 114, "x.io/a:_tag.1-" + "b" * 114),      # a tag of exactly 128
])
def test_references_are_normalised_as_the_runtime_reads_them(text: str, normalised: str) -> None:
    assert str(parse_reference(text)) == normalised


@pytest.mark.parametrize(("text", "why"), [
    ("nginx:tägé", "invalid tag"),                                    # \w would take Unicode letters
    ("ng\u0131nx", "invalid repository"),                            # a dotless i
    (f"nginx:1.0\n@{DIGEST}", "invalid tag"),                          # $ would match before the newline
    (f"nginx@{DIGEST}\nx", "invalid digest"),
    (f"nginx@sha256:{HEX64[:-1]}", "invalid sha256 digest"),
    (f"nginx@sha256:{HEX64}00", "invalid sha256 digest"),
    (f"nginx@sha256:{HEX64.upper()}", "invalid sha256 digest"),
    (f"nginx@sha512:{HEX64}", "invalid sha512 digest"),
    (f"nginx@md5:{HEX64[:32]}", "unknown algorithm 'md5'"),
    (f"nginx@SHA256:{HEX64}", "unknown algorithm 'SHA256'"),
    ("docker.io/Nginx", "invalid repository 'Nginx'"),                 # repositories are lowercase
    ("registry.acme.com/Shop/web", "invalid repository"),
    ("x.io/" + "a" * 251, "a name of 256 characters"),
    ("a" * 245, "a name of 263 characters"),                          # docker.io/library/ counts
    (HEX64, "an image ID"),
    ("nginx:.hidden", "invalid tag"),
    ("nginx:" + "t" * 129, "invalid tag"),
    ("bad_host.io:x/y", "invalid registry host"),
    ("[::1/x", "invalid registry host"),
    ("x.io/a:1:2", "invalid repository"),
    ("x.io//a", "invalid repository"),
    ("nginx ", "surrounding spaces"),
    ("", "empty"),
])
def test_invalid_references_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_reference(text)


def pod(*images: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"containers": [{"name": f"c{i}", "image": image} for i, image in enumerate(images)]}}


def judge_images(config: Mapping[str, Any], obj: Any, old: Any = None, operation: str = "CREATE") -> list[str]:
    plugin = ImageReferences()
    request = PluginRequest(obj, old, {"operation": operation})
    return [str(failure) for failure in plugin.validate(plugin.configure(config), request)]


def test_a_digest_after_a_newline_or_of_the_wrong_form_does_not_count_as_pinned() -> None:
    failures = judge_images({"requireDigest": True}, pod(
        f"nginx:1.0\n@{DIGEST}", f"nginx@sha256:{HEX64[:40]}", f"nginx@sha256:{HEX64.upper()}", f"nginx@{DIGEST}"))
    assert [f.split(":")[0] for f in failures] == [f"spec.containers[{i}].image" for i in range(3)]
    assert all("is not a valid image reference" in f for f in failures)


# --- image-references: the allowlist ------------------------------------------------------------

@pytest.mark.parametrize(("entry", "read_as"), [
    ("registry.acme.com", "registry.acme.com"),
    ("Registry.Acme.com", "registry.acme.com"),
    ("localhost", "localhost"),
    ("localhost:5000", "localhost:5000"),
    ("[::1]:5000", "[::1]:5000"),
    ("index.docker.io", "docker.io"),
    ("docker.io/library/nginx", "docker.io/library/nginx"),
    ("docker.io/library", "docker.io/library"),
    ("docker.io/bitnami/", "docker.io/bitnami"),
    ("bitnami/", "docker.io/bitnami"),
    ("bitnami/redis", "docker.io/bitnami/redis"),
    ("library/nginx", "docker.io/library/nginx"),
    ("quay.io/shop", "quay.io/shop"),
    ("quay.io/shop/", "quay.io/shop"),
])
def test_allowlist_entries_are_read_as_image_names(entry: str, read_as: str) -> None:
    (allowed,) = ImageReferences().configure({"allowedRegistries": [entry]}).allowed or ()
    assert str(allowed) == read_as


@pytest.mark.parametrize(("entry", "message"), [
    ("nginx", "'nginx' is not a registry host (a host has a '.' or a port, or is localhost): write "
              "docker.io/library/nginx for that Docker Hub image, or nginx/ for the docker.io/nginx/ namespace"),
    ("docker.io/nginx", "'docker.io/nginx' could be read two ways: write docker.io/library/nginx for the "
                        "official image, or docker.io/nginx/ for the namespace"),
    ("index.docker.io/bitnami", "could be read two ways"),
    ("x.io/app:1.0", "'x.io/app:1.0' has an invalid repository path 'app:1.0'"),
    ("x.io/App", "invalid repository path 'App'"),
    ("bad_host.io/x", "'bad_host.io/x' has an invalid registry host 'bad_host.io'"),
    ("/x", "invalid repository path '/x'"),
])
def test_ambiguous_or_invalid_allowlist_entries_are_refused_naming_them(entry: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ImageReferences().configure({"allowedRegistries": ["ok.io", entry]})
    assert caught.value.path == "allowedRegistries[1]"
    assert message in caught.value.message


def test_a_refused_entry_is_a_compile_error_naming_the_field() -> None:
    spec = policy_body("pods", {"name": "image-references", "config": {"allowedRegistries": ["nginx"]}})
    with pytest.raises(PolicyCompileError, match=r"plugin.config.allowedRegistries\[0\]: 'nginx' is not a registry"):
        compile_policy(parse_policy(spec), registry=REGISTRY, gates=features.parse("", REGISTRY))


@pytest.mark.parametrize(("entry", "allowed", "denied"), [
    ("docker.io/library/nginx", ["nginx", "docker.io/nginx:1", f"index.docker.io/library/nginx@{DIGEST}"],
     ["nginx-unprivileged", "bitnami/nginx", "nginx.io/nginx"]),
    ("docker.io/bitnami/", ["bitnami/redis", "docker.io/bitnami/redis:7"], ["bitnami", "redis", "bitnamix/redis"]),
    ("docker.io/library", ["nginx", "redis:7"], ["bitnami/redis"]),
    ("localhost:5000", ["localhost:5000/x", "localhost:5000/a/b:1"], ["localhost/x", "localhost:5001/x", "x"]),
    ("registry:5000", ["registry:5000/x:tag"], ["registry/x", "registry.io:5000/x"]),
    ("[::1]:5000", ["[::1]:5000/x"], ["[::1]/x", "[::2]:5000/x"]),
])
def test_the_allowlist_matches_as_the_runtime_pulls(entry: str, allowed: list[str], denied: list[str]) -> None:
    config = {"allowedRegistries": [entry]}
    assert judge_images(config, pod(*allowed)) == []
    failures = judge_images(config, pod(*denied))
    assert len(failures) == len(denied) and all("is not from an allowed registry" in f for f in failures)
