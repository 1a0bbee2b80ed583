"""``image-references``: container images parsed as the container runtime reads them.

CEL sees an image as a string, and prefix checks on it are wrong in ways that matter: ``nginx`` is
``docker.io/library/nginx:latest``, ``registry.acme.com.evil.io/x`` is not on
``registry.acme.com``, ``localhost:5000/x`` names a registry with a port, and ``name:tag@sha256:…``
is pinned by its digest whatever its tag says. This plugin parses every image of a Pod (or a
Pod template: policies on Pods also judge workloads) with the grammar of
``github.com/distribution/reference`` — ASCII only, the whole string, a name of at most 255
characters, a digest of an algorithm the OCI image spec registers (``sha256`` and ``blake3``:
64 lowercase hex digits, ``sha512``: 128) — normalises it, and checks:

- ``requireDigest``: the image is pinned by a digest (``@sha256:…``);
- ``allowedRegistries``: its registry — or a repository prefix under it, matched by whole path
  components — is on the list. An entry is read as an image name is (``bitnami/redis`` is
  ``docker.io/bitnami/redis``, ``index.docker.io`` is ``docker.io``); a trailing ``/`` marks a
  namespace, its path taken as written (``docker.io/bitnami/``). An entry an image name could
  read two ways is refused, naming the spellings to use: ``nginx`` (a registry host has a ``.``
  or a port, or is ``localhost``) and ``docker.io/nginx`` (the official image
  ``docker.io/library/nginx``, or the namespace ``docker.io/nginx/``); ``docker.io/library`` is
  the namespace of the official images;
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
LEGACY_DEFAULT_REGISTRY: Final = "index.docker.io"
OFFICIAL_NAMESPACE: Final = "library"
NAME_MAX: Final = 255      # distribution/reference's limit, on the normalised name
TEXT_MAX: Final = 1024     # more than a name, a tag and the longest digest: refused before parsing
# The digest algorithms the OCI image spec registers, and the lowercase hex digits of each.
DIGEST_HEX_DIGITS: Final = {"sha256": 64, "sha512": 128, "blake3": 64}

# distribution/reference's grammar in ASCII classes (Python's \w is Unicode), always fullmatch-ed
# (``$`` would match before a trailing newline).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?")
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_LOWER_HEX = re.compile(r"[0-9a-f]+")
_IMAGE_ID = re.compile(r"[0-9a-f]{64}")
CONTAINER_FIELDS: Final = ("initContainers", "containers", "ephemeralContainers")


class ImageReferenceError(ValueError):
    """Text the runtime would not read as an image reference; the message says why."""


@dataclasses.dataclass(frozen=True)
class ImageReference:
    """An image as the runtime pulls it, normalised (``nginx`` is ``docker.io/library/nginx``),
    so that checks compare what is pulled, not how it was spelt; ``str()`` is the full form."""
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
    """Parse and normalise an image reference; ValueError (saying what is wrong) when it is not one."""
    if not text or text != text.strip():
        raise ImageReferenceError("is empty or has surrounding spaces")
    if len(text) > TEXT_MAX:
        raise ImageReferenceError(f"is longer than {TEXT_MAX} characters")
    if _IMAGE_ID.fullmatch(text):
        raise ImageReferenceError("is 64 hex digits: an image ID, not a name the runtime pulls")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        _check_digest(digest)
    tag = None
    colon, slash = rest.rfind(":"), rest.rfind("/")
    if colon > slash:   # a ':' after the last '/' starts the tag; one before it is a registry's port
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise ImageReferenceError(f"has an invalid tag {tag!r} (ASCII letters, digits, '_', '.', '-'; "
                                      f"at most 128, not starting with '.' or '-')")
    registry, path = _split_registry(rest)
    if not _PATH.fullmatch(path):
        raise ImageReferenceError(f"has an invalid repository {path!r} (lowercase letters, digits and separators)")
    reference = ImageReference(registry, _official(registry, path), tag, digest)
    if len(reference.name) > NAME_MAX:
        raise ImageReferenceError(f"has a name of {len(reference.name)} characters (at most {NAME_MAX})")
    return reference


def _check_digest(digest: str) -> None:
    if not _DIGEST.fullmatch(digest):
        raise ImageReferenceError(f"has an invalid digest {digest!r}")
    algorithm, encoded = digest.split(":", 1)
    digits = DIGEST_HEX_DIGITS.get(algorithm)
    if digits is None:
        raise ImageReferenceError(f"has a digest of an unknown algorithm {algorithm!r} "
                                  f"(known: {', '.join(DIGEST_HEX_DIGITS)})")
    if len(encoded) != digits or not _LOWER_HEX.fullmatch(encoded):
        raise ImageReferenceError(f"has an invalid {algorithm} digest (it is {digits} lowercase hex digits)")


def _names_registry(first: str) -> bool:
    """Whether a name's first component is a registry host, as the runtime decides: it has a '.'
    or a port, is localhost, or is not lowercase; anything else is a path on docker.io."""
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def _split_registry(name: str) -> tuple[str, str]:
    """(registry, path) of a name without tag or digest; the registry lowercased, index.docker.io
    as docker.io."""
    first, sep, rest = name.partition("/")
    if not sep or not _names_registry(first):
        return DEFAULT_REGISTRY, name
    if not _DOMAIN.fullmatch(first):
        raise ImageReferenceError(f"has an invalid registry host {first!r}")
    registry = first.lower()
    return (DEFAULT_REGISTRY if registry == LEGACY_DEFAULT_REGISTRY else registry), rest


def _official(registry: str, path: str) -> str:
    """Docker Hub's one-component names are its official images, under library/."""
    return f"{OFFICIAL_NAMESPACE}/{path}" if registry == DEFAULT_REGISTRY and "/" not in path else path


@dataclasses.dataclass(frozen=True)
class Allowed:
    """An allowlist entry: a registry (host[:port]) and optionally a repository prefix under it."""
    registry: str
    prefix: str

    def matches(self, ref: ImageReference) -> bool:
        """By whole path components: ``acme`` covers ``acme/app``, not ``acme-evil/app``."""
        if ref.registry != self.registry:
            return False
        return not self.prefix or ref.repository == self.prefix or ref.repository.startswith(self.prefix + "/")

    def __str__(self) -> str:
        return f"{self.registry}/{self.prefix}" if self.prefix else self.registry


@dataclasses.dataclass(frozen=True)
class Config:
    """The config as ``configure`` prepares it, once per policy generation: the allowlist is
    parsed there, not on each request."""
    require_digest: bool
    allowed: tuple[Allowed, ...] | None
    exempt_unchanged: bool


def _allowed_entry(text: str) -> Allowed:
    """An allowlist entry read as an image name is (see the module docstring); ValueError naming
    it, with the spellings to use, when it is not one or could be read two ways."""
    namespace = text.endswith("/")
    name = text[:-1] if namespace else text
    if "/" not in name and not _names_registry(name):
        if namespace:      # "bitnami/": a namespace on docker.io
            return _allowed_path(text, DEFAULT_REGISTRY, name)
        raise ValueError(f"{text!r} is not a registry host (a host has a '.' or a port, or is localhost): "
                         f"write docker.io/library/{text} for that Docker Hub image, or {text}/ for the "
                         f"docker.io/{text}/ namespace")
    try:
        registry, path = _split_registry(name if "/" in name else f"{name}/")
    except ImageReferenceError as exc:
        raise ValueError(f"{text!r} {exc}") from None
    if registry == DEFAULT_REGISTRY and path and "/" not in path and path != OFFICIAL_NAMESPACE and not namespace:
        raise ValueError(f"{text!r} could be read two ways: write docker.io/library/{path} for the official "
                         f"image, or docker.io/{path}/ for the namespace")
    return _allowed_path(text, registry, path)


def _allowed_path(text: str, registry: str, path: str) -> Allowed:
    if path and not _PATH.fullmatch(path):
        raise ValueError(f"{text!r} has an invalid repository path {path!r} "
                         f"(lowercase letters, digits and separators; no tag or digest)")
    return Allowed(registry, path)


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
    """Shipped with the operator and registered as anyone's plugin is (an entry point in
    pyproject.toml); what it checks and why is the module's docstring."""
    name: ClassVar[str] = "image-references"
    version: ClassVar[str] = "1.1.0"
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
                "description": ("Registries (host[:port]), or repository prefixes under one (host/path), read as "
                                "image names are (bitnami/redis is docker.io/bitnami/redis); a trailing '/' marks "
                                "a namespace (docker.io/bitnami/). 'nginx' and 'docker.io/nginx' are refused as "
                                "ambiguous: write docker.io/library/nginx or docker.io/nginx/."),
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
