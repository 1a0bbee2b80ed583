"""Python plugins: the rules CEL cannot express, used beside CEL in one policy.

A policy names a plugin where it would write CEL::

    validations:
      - plugin: {name: image-references, config: {requireDigest: true}}
    mutations:
      - plugin: {name: some-mutator, config: {...}}

A plugin is a class (or an instance) registered under the entry point group
``admission_policy.plugins``; it subclasses :class:`ValidatorPlugin` (returns failures) or
:class:`MutatorPlugin` (returns a JSON patch or a new object), and declares its ``name``,
``version``, ``config_schema`` (JSON Schema, checked when a policy is compiled, so a bad config is
refused at ``kubectl apply`` naming the field) and the feature gate that switches it
(``admission_policy.features``).

The contract, because plugins run on the admission hot path:

- **pure with respect to the request**: no I/O in ``validate``/``mutate``; what a plugin needs
  comes in its config, the request, the policy's ``params`` and ``context`` (watched by the
  operator, from files offline: declare them in the policy), or data the plugin fetches in the
  background with :class:`Refreshed` (one result held, refreshed on its own thread, never
  silently stale);
- **bounded**: each call runs on a worker thread of the engine's (``engine/plugincalls.py``), which
  waits for it at most ``time_budget`` seconds (or what is left of the request's deadline) and
  then answers at once with an evaluation error of the policy. The call is stopped (``CallStopped``,
  a BaseException, raised in its thread: that ends Python code, not a call blocked in C such as a
  sleep), logged once at ERROR, and until it returns the plugin's further calls fail at once.
  Raising anything (``sys.exit()`` too; KeyboardInterrupt goes through) or returning anything but
  what is documented here is an evaluation error too: the policy's ``failurePolicy`` decides, the
  server never crashes;
- **copies in, JSON out**: ``PluginRequest`` values are the plugin's own copies, each made when
  first read, so it pays only for what it reads and changes nothing other policies, later
  plugins, the response or the operator's caches see; a ``context`` list is a read-only sequence
  copying one object as it is read (it may hold thousands). A mutator may change
  ``request.object`` and return it. What a plugin returns is checked and copied: a failure is a
  non-empty str or a Failure with a non-empty str message; a mutator's object and patch values are
  JSON data (dicts with str keys, lists, str, int, finite float, bool, None), and the error for
  anything else names the plugin and where it is.

Discovery (``discover``) loads every entry point once. The plugins shipped in
``admission_policy.builtin_plugins`` are entry points of this package's own (pyproject.toml), so
this module imports none of them and they load as anyone's do. One that fails to load (``sys.exit()``
included) is listed by ``admission-policy plugins`` with its error, logged at WARNING when the
operator starts, and a policy naming it is refused with that error. Plugins never import the
operator.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import importlib.metadata
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final, Generic, Literal, TypeAlias, TypeVar

import jsonschema

from .errors import AdmissionPolicyError

ENTRY_POINT_GROUP: Final = "admission_policy.plugins"
DISTRIBUTION: Final = "admission-policy-operator"   # whose entry points are the builtins (pyproject.toml)
logger = logging.getLogger(__name__)
T = TypeVar("T")

Stage: TypeAlias = Literal["Alpha", "Beta", "GA"]
Kind: TypeAlias = Literal["validator", "mutator"]


@dataclasses.dataclass(frozen=True)
class PluginRequest:
    """What a plugin sees of one admission request (the same values CEL binds). The engine passes
    copies made on first read (``engine.plugincalls.IsolatedRequest``); a plugin's own tests build
    one with plain values."""
    object: Any                          # None on DELETE
    old_object: Any                      # None on CREATE
    request: Mapping[str, Any]           # the AdmissionRequest, as CEL's ``request``
    namespace_object: Mapping[str, Any] | None = None
    # The policy's param object (one call per param, as for CEL; None without spec.paramKind) and
    # its context lists by entry name (spec.context): the way a plugin gets cluster data without I/O.
    # From the engine, each list is a read-only sequence (index, iterate, len) of copies made as read.
    params: Mapping[str, Any] | None = None
    context: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)

    @property
    def operation(self) -> str:
        return str(self.request.get("operation", ""))


@dataclasses.dataclass(frozen=True)
class Failure:
    """One failed check: its message, and optionally the field it is about."""
    message: str
    field: str = ""

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class ConfigError(AdmissionPolicyError, ValueError):
    """A config the plugin refuses (beyond its schema); ``path`` is relative to ``config``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class Plugin(abc.ABC):
    """What every plugin declares. Subclass :class:`ValidatorPlugin` or :class:`MutatorPlugin`."""
    kind: ClassVar[Kind]
    name: ClassVar[str]                  # what policies write in ``plugin.name``
    version: ClassVar[str] = "0"
    description: ClassVar[str] = ""
    config_schema: ClassVar[Mapping[str, Any]] = {"type": "object"}
    # The feature gate switching the plugin (default: derived from the name, see gate_name) and
    # its maturity: Alpha is off by default, Beta on, GA always on.
    feature_gate: ClassVar[str | None] = None
    stage: ClassVar[Stage] = "Alpha"
    time_budget: ClassVar[float] = 0.05  # seconds per call; past it the call is abandoned: an evaluation error

    def configure(self, config: Mapping[str, Any]) -> Any:
        """Prepare a config that passed ``config_schema``, once per policy generation (compile
        time, not per request). Raise ConfigError for what the schema cannot say. The result is
        what ``validate``/``mutate`` receive as ``config``."""
        return config

    @classmethod
    def gate_name(cls) -> str:
        """``image-references`` → ``ImageReferencesPlugin``."""
        words = cls.name.replace("_", "-").split("-")
        return cls.feature_gate or "".join(word.capitalize() for word in words) + "Plugin"


class ValidatorPlugin(Plugin):
    """A check CEL cannot express; its failures count as a CEL validation's would (the
    policy's enforcement decides whether they deny, warn or are audited)."""
    kind: ClassVar[Kind] = "validator"

    @abc.abstractmethod
    def validate(self, config: Any, request: PluginRequest) -> Sequence[str | Failure]:
        """Every failure of the request against this check; empty when it passes."""


class MutatorPlugin(Plugin):
    """A change CEL cannot compute; it runs in the policy's mutation order, on the object as the
    earlier mutations left it."""
    kind: ClassVar[Kind] = "mutator"

    @abc.abstractmethod
    def mutate(self, config: Any, request: PluginRequest) -> Sequence[Mapping[str, Any]] | Mapping[str, Any] | None:
        """An RFC 6902 JSON patch (a list of operations) against ``request.object``, or the whole
        new object (``request.object`` is a copy the plugin may change), or None for no change.
        Mutations must be idempotent: the API server may call again."""


class StaleData(AdmissionPolicyError):
    """What :meth:`Refreshed.value` raises when it has no value young enough: the call is an
    evaluation error naming the plugin, and the policy's failurePolicy decides."""


class Refreshed(Generic[T]):
    """Data a plugin needs from outside (a registry's allowlist, a CRL, a file), fetched off the
    hot path: ``fetch()`` runs on a daemon thread of its own, first when ``value()`` is first
    read and then every ``every`` seconds, and ``value()`` returns the last good result at once,
    never doing I/O. Bounded: it holds one result, the one ``fetch`` returned last; a failed fetch
    keeps the previous result and is logged.

    Never silently stale: with no result yet, or one older than ``max_age`` seconds (default three
    refresh intervals), ``value()`` raises :class:`StaleData` saying why (the last error).
    Create it once per plugin (a class attribute, or in ``__init__``), not per call.
    """

    def __init__(self, fetch: Callable[[], T], every: float, *, max_age: float | None = None,
                 name: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        if every <= 0:
            raise ValueError(f"Refreshed: every must be a positive number of seconds, not {every!r}")
        self.fetch = fetch
        self.every = every
        self.max_age = 3 * every if max_age is None else max_age
        self.name = name or getattr(fetch, "__qualname__", "data")
        self.clock = clock
        self._result: tuple[float, T] | None = None   # when fetched, what
        self._error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.refreshed = threading.Event()   # set once a fetch has succeeded (to wait for the first)
        self._thread: threading.Thread | None = None

    def value(self) -> T:
        """The last good result; StaleData when there is none yet, or it is older than ``max_age``."""
        self.start()
        result = self._result
        if result is None:
            raise StaleData(f"{self.name} is not fetched yet" + (f" (last attempt: {self._error})"
                                                                 if self._error else ""))
        age = self.clock() - result[0]
        if age > self.max_age:
            raise StaleData(f"{self.name} was last fetched {age:.0f} s ago, over its max_age of "
                            f"{self.max_age:.0f} s (last error: {self._error or 'none'})")
        return result[1]

    def refresh(self) -> bool:
        """Fetch now, in this thread (the background thread's step; tests call it too): True when
        a new result is kept."""
        started = self.clock()
        try:
            fetched = self.fetch()
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
            logger.warning("Refreshing %s failed (the last good value is kept): %s", self.name, self._error)
            return False
        self._result, self._error = (started, fetched), ""
        self.refreshed.set()
        return True

    def start(self) -> None:
        """Start the background thread, once (``value()`` does it)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"refresh {self.name}", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """End the background thread at its next wake-up; ``value()`` then ages into StaleData."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.every)


@dataclasses.dataclass(frozen=True)
class Broken:
    """An entry point that could not be loaded, with why."""
    name: str
    source: str
    error: str


@dataclasses.dataclass(frozen=True)
class Registry:
    """The plugins a process can use, and the ones it cannot (``broken``), kept so that a policy
    naming one is refused with the load error rather than with "unknown plugin"."""
    plugins: Mapping[str, Plugin]
    sources: Mapping[str, str]           # name → "builtin" or the distribution that provides it
    broken: tuple[Broken, ...] = ()

    def get(self, name: str) -> Plugin | None:
        return self.plugins.get(name)


def check_config(plugin: Plugin, config: Any) -> tuple[Any, list[tuple[str, str]]]:
    """The prepared config, or the errors as (path relative to the config, message)."""
    validator = jsonschema.Draft202012Validator(plugin.config_schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        return None, [(field_path(error.absolute_path), error.message) for error in errors]
    try:
        return plugin.configure(config), []
    except ConfigError as error:
        return None, [(error.path, error.message)]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:   # a plugin's defect, sys.exit() included: still a message, never a crash
        return None, [("", f"plugin {plugin.name!r} failed to read its config: {type(exc).__name__}: {exc}")]


def field_path(path: Sequence[Any]) -> str:
    """``["spec", 0, "x"]`` → ``spec[0].x``: how messages name a place in a config or a value."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def discover(group: str = ENTRY_POINT_GROUP) -> Registry:
    """This package's own plugins (its entry points in ``admission_policy.plugins``, listed as
    ``builtin``), then every other entry point of ``group`` (a class or an instance). The builtins
    load first, so a third-party plugin cannot take their names; they are found as anyone's
    plugin is, so this module imports none of them."""
    plugins: dict[str, Plugin] = {}
    sources: dict[str, str] = {}
    broken: list[Broken] = []
    own = _normalised(DISTRIBUTION)
    builtins = [(entry, "builtin") for entry in importlib.metadata.distribution(DISTRIBUTION).entry_points
                if entry.group == ENTRY_POINT_GROUP]
    others = [(entry, entry.dist.name if entry.dist is not None else entry.value)
              for entry in importlib.metadata.entry_points(group=group)
              if entry.dist is None or _normalised(entry.dist.name) != own]
    for entry, source in builtins + others:
        try:
            plugin = _load(entry)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:   # sys.exit() at import too: the plugin is unavailable, the server runs
            broken.append(Broken(entry.name, source, f"{type(exc).__name__}: {exc}"))
            continue
        if plugin.name in plugins:
            broken.append(Broken(entry.name, source, f"plugin name {plugin.name!r} is already provided by "
                                                     f"{sources[plugin.name]}"))
            continue
        plugins[plugin.name], sources[plugin.name] = plugin, source
    return Registry(plugins, sources, tuple(broken))


def _load(entry: importlib.metadata.EntryPoint) -> Plugin:
    """The plugin an entry point names, checked: TypeError or the import's own error if it is not one."""
    loaded = entry.load()
    plugin = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(plugin, (ValidatorPlugin, MutatorPlugin)):
        raise TypeError(f"{entry.value} is not a ValidatorPlugin or MutatorPlugin")
    if not isinstance(getattr(plugin, "name", None), str) or not plugin.name:
        raise TypeError(f"{entry.value} has no name")
    jsonschema.Draft202012Validator.check_schema(plugin.config_schema)
    return plugin


def _normalised(distribution: str) -> str:
    """A distribution's name as PEP 503 compares them (``admission_policy-Operator`` is ours)."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


@functools.cache
def registry() -> Registry:
    """The process's plugins, discovered once."""
    return discover()
