"""Feature gates, Kubernetes style: ``--feature-gates=Name=true,Other=false`` (or the environment
variable ``AP_FEATURE_GATES``, or the chart's ``featureGates`` value).

Each gate has a stage that sets its default: Alpha off, Beta on, GA on and locked (setting a GA
gate to false is an error, as in Kubernetes). The gates are the project's own experimental
features (``CORE``) and one per installed plugin (``Plugin.gate_name``/``stage``). An unknown
gate name is an error at startup, so a misspelt gate never silently does nothing.

``current()`` is the process's gates, set once at startup (``configure``); the compiler reads it
when a policy is compiled, so a gate switched off makes the policies using its plugin report it
(condition ``PluginsEnabled``, phase Degraded) and skip those rules.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Final

from .errors import AdmissionPolicyError
from .plugins import Registry, Stage, registry

ENV: Final = "AP_FEATURE_GATES"


@dataclasses.dataclass(frozen=True)
class Gate:
    """A switch for one experimental feature; its ``stage`` sets the default, as in Kubernetes."""
    name: str
    stage: Stage
    description: str = ""

    @property
    def default(self) -> bool:
        return self.stage != "Alpha"


# The project's own gates (none of its features is experimental beyond the plugins so far; the
# plugin mechanism itself is one).
CORE: Final = (
    Gate("PythonPlugins", "Beta", "Policies may use Python plugins (validations[].plugin, mutations[].plugin)."),
)


class FeatureGateError(AdmissionPolicyError, ValueError):
    """A ``--feature-gates`` item that is malformed, names no gate or switches a GA gate off:
    refused, so a misspelt gate never silently does nothing."""


@dataclasses.dataclass(frozen=True)
class FeatureGates:
    """The gates in effect: the known ones, at their stage's default unless the flags set them
    (``overrides``, checked by ``parse``). A name no gate has is off."""
    known: Mapping[str, Gate]
    overrides: Mapping[str, bool] = dataclasses.field(default_factory=dict)

    def enabled(self, name: str) -> bool:
        if name in self.overrides:
            return self.overrides[name]
        gate = self.known.get(name)
        return gate.default if gate else False

    def items(self) -> list[tuple[Gate, bool]]:
        return [(gate, self.enabled(gate.name)) for gate in sorted(self.known.values(), key=lambda g: g.name)]


def known_gates(plugins: Registry | None = None) -> dict[str, Gate]:
    """The project's gates and one per plugin (two plugins may share a gate: the first wins)."""
    gates = {gate.name: gate for gate in CORE}
    for plugin in (plugins or registry()).plugins.values():
        gates.setdefault(plugin.gate_name(), Gate(plugin.gate_name(), plugin.stage, f"The {plugin.name} plugin."))
    return gates


def parse(text: str | Iterable[str], plugins: Registry | None = None) -> FeatureGates:
    """``Name=true,Other=false`` (several flags may be given: later ones win)."""
    known = known_gates(plugins)
    overrides: dict[str, bool] = {}
    for chunk in ([text] if isinstance(text, str) else list(text)):
        for item in filter(None, (part.strip() for part in chunk.split(","))):
            name, sep, value = item.partition("=")
            name, value = name.strip(), value.strip().lower()
            if not sep or value not in ("true", "false"):
                raise FeatureGateError(f"feature gate {item!r}: expected Name=true or Name=false")
            if name not in known:
                raise FeatureGateError(f"unknown feature gate {name!r} (known: {', '.join(sorted(known))})")
            if known[name].stage == "GA" and value == "false":
                raise FeatureGateError(f"feature gate {name} is GA and cannot be switched off")
            overrides[name] = value == "true"
    return FeatureGates(known, overrides)


_current: FeatureGates | None = None


def configure(gates: FeatureGates | None) -> None:
    """Set the process's gates (None: back to the defaults and AP_FEATURE_GATES)."""
    global _current
    _current = gates


def current() -> FeatureGates:
    """The process's gates: what ``configure`` set, else ``AP_FEATURE_GATES`` (read once)."""
    global _current
    if _current is None:
        _current = parse(os.environ.get(ENV, ""))
    return _current
