"""``image-references``: container images parsed as the container runtime reads them.

CEL sees an image as a string, and prefix checks on it are wrong in ways that matter: ``nginx`` is
``docker.io/library/nginx:latest``, ``registry.acme.com.evil.io/x`` is not on
``registry.acme.com``, ``localhost:5000/x`` names a registry with a port, and ``name:tag@sha256:…``
is pinned by its digest whatever its tag says. This plugin parses every image of a Pod (or a
Pod template: policies on Pods also judge workloads) with the grammar of
``github.com/distribution/reference``, normalises it, and checks:

- ``requireDigest``: the image is pinned by a digest (``@sha256:…``);
- ``allowedRegistries``: its registry (``docker.io`` for unqualified names) — or a repository
  prefix under it, matched by whole path components — is on the list;
- ``exemptUnchanged`` (default true): an image the old object already had passes on UPDATE, so
  relabelling a Pod created before the policy keeps working.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final

from ..plugins import ConfigError, Failure, PluginRequest, Stage, ValidatorPlugin

DEFAULT_REGISTRY: Final = "docker.io"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$")
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
CONTAINER_FIELDS: Final = ("initContainers", "containers", "ephemeralContainers")


class ReferenceError_(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class ImageReference:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        if not tag and not digest:
            tag = ":latest"
        return f"{self.name}{tag}{digest}"


def parse_reference(text: str) -> ImageReference:
    """Parse and normalise an image reference; ValueError when it is not one."""
    if not text or text != text.strip() or len(text) > 4096:
        raise ReferenceError_("is empty or has surrounding spaces" if len(text) <= 4096 else "is too long")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise ReferenceError_(f"has an invalid digest {digest!r}")
    tag = None
    colon, slash = rest.rfind(":"), rest.rfind("/")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.match(tag):
            raise ReferenceError_(f"has an invalid tag {tag!r}")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        registry, path = first, remainder
        if not _DOMAIN.match(registry):
            raise ReferenceError_(f"has an invalid registry host {registry!r}")
    else:
        registry, path = DEFAULT_REGISTRY, rest
    registry = registry.lower()
    if registry == "index.docker.io":
        registry = DEFAULT_REGISTRY
    if not _PATH.match(path):
        raise ReferenceError_(f"has an invalid repository {path!r} (lowercase letters, digits and separators)")
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    return ImageReference(registry, path, tag, digest)


@dataclasses.dataclass(frozen=True)
class Allowed:
    """An allowlist entry: a registry (host[:port]) and optionally a repository prefix under it."""
    registry: str
    prefix: str

    def matches(self, ref: ImageReference) -> bool:
        if ref.registry != self.registry:
            return False
        return not self.prefix or ref.repository == self.prefix or ref.repository.startswith(self.prefix + "/")

    def __str__(self) -> str:
        return f"{self.registry}/{self.prefix}" if self.prefix else self.registry


@dataclasses.dataclass(frozen=True)
class Config:
    require_digest: bool
    allowed: tuple[Allowed, ...] | None
    exempt_unchanged: bool


def _allowed_entry(text: str) -> Allowed:
    host, _, prefix = text.strip("/").partition("/")
    host = host.lower()
    if host == "index.docker.io":
        host = DEFAULT_REGISTRY
    if not _DOMAIN.match(host):
        raise ValueError(f"{host!r} is not a registry host (name or name:port)")
    if prefix and not _PATH.match(prefix):
        raise ValueError(f"{prefix!r} is not a repository path")
    return Allowed(host, prefix)


def images(body: Any) -> Iterator[tuple[str, str]]:
    """(field path, image) of every container of a Pod (or Pod view of a template)."""
    spec = body.get("spec") if isinstance(body, Mapping) else None
    if not isinstance(spec, Mapping):
        return
    for field in CONTAINER_FIELDS:
        containers = spec.get(field)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            image = container.get("image") if isinstance(container, Mapping) else None
            if isinstance(image, str):
                yield f"spec.{field}[{i}].image", image


class ImageReferences(ValidatorPlugin):
    name: ClassVar[str] = "image-references"
    version: ClassVar[str] = "1.0.0"
    description: ClassVar[str] = ("Parses and normalises container images; requires digests and/or an allowlist of "
                                  "registries (docker.io defaults, ports and look-alike hosts handled).")
    stage: ClassVar[Stage] = "Beta"
    config_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "requireDigest": {"type": "boolean", "description": "Every image must be pinned by a digest."},
            "allowedRegistries": {
                "type": "array", "minItems": 1, "maxItems": 256,
                "items": {"type": "string", "minLength": 1, "maxLength": 512},
                "description": "Registries (host[:port]), or repository prefixes under one (host/path).",
            },
            "exemptUnchanged": {"type": "boolean", "description": "On UPDATE, images the old object had pass."},
        },
        "anyOf": [{"required": ["requireDigest"]}, {"required": ["allowedRegistries"]}],
    }

    def configure(self, config: Mapping[str, Any]) -> Config:
        allowed = None
        if "allowedRegistries" in config:
            entries = []
            for i, entry in enumerate(config["allowedRegistries"]):
                try:
                    entries.append(_allowed_entry(entry))
                except ValueError as exc:
                    raise ConfigError(f"allowedRegistries[{i}]", str(exc)) from None
            allowed = tuple(entries)
        return Config(bool(config.get("requireDigest", False)), allowed, bool(config.get("exemptUnchanged", True)))

    def validate(self, config: Config, request: PluginRequest) -> Sequence[Failure]:
        old = {image for _, image in images(request.old_object)} if config.exempt_unchanged else set()
        failures = []
        for field, image in images(request.object):
            if image in old:
                continue
            try:
                ref = parse_reference(image)
            except ValueError as exc:
                failures.append(Failure(f"{image!r} is not a valid image reference: it {exc}", field))
                continue
            if config.allowed is not None and not any(entry.matches(ref) for entry in config.allowed):
                allowed = ", ".join(map(str, config.allowed))
                failures.append(Failure(f"{image} ({ref}) is not from an allowed registry ({allowed})", field))
            if config.require_digest and ref.digest is None:
                failures.append(Failure(f"{image} is not pinned by a digest (name@sha256:...)", field))
        return failures
