"""An immutable, indexed set of compiled policies.

The index maps (group, resource, subresource) to the policies whose rules name them, so a
request costs a handful of dict lookups however many policies are installed, and a request
that no rule names evaluates no CEL at all.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Final

from ..api import ResourceRule
from .compiler import CompiledPolicy
from .request import AdmissionRequest

_Key = tuple[str, str, str, str]  # group, resource, subresource, operation ("*" = any)
_Entry = tuple[int, CompiledPolicy, ResourceRule]

_ANY: Final = "*"


class PolicySet:
    """Policies in name order, with candidate lookup by what a request addresses."""

    def __init__(self, policies: Iterable[CompiledPolicy] = ()) -> None:
        ordered = sorted(policies, key=lambda p: p.name)
        names = [p.name for p in ordered]
        if len(set(names)) != len(names):
            raise ValueError("policy names must be unique in a PolicySet")
        self._policies: tuple[CompiledPolicy, ...] = tuple(ordered)
        index: defaultdict[_Key, list[_Entry]] = defaultdict(list)
        for order, policy in enumerate(ordered):
            for rule in policy.policy.match.resources:
                for key in _rule_keys(rule):
                    index[key].append((order, policy, rule))
        self._index: dict[_Key, tuple[_Entry, ...]] = {k: tuple(v) for k, v in index.items()}

    def __len__(self) -> int:
        return len(self._policies)

    def __iter__(self) -> Iterator[CompiledPolicy]:
        return iter(self._policies)

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self._policies)

    def get(self, name: str) -> CompiledPolicy | None:
        return next((p for p in self._policies if p.name == name), None)

    def replace(self, policy: CompiledPolicy) -> PolicySet:
        """A new set with this policy added or replacing the one of the same name."""
        return PolicySet([p for p in self._policies if p.name != policy.name] + [policy])

    def remove(self, name: str) -> PolicySet:
        return PolicySet(p for p in self._policies if p.name != name)

    def candidates(self, request: AdmissionRequest) -> list[CompiledPolicy]:
        """Policies with a rule naming this request's resource, operation and version."""
        subresources = (request.sub_resource, _ANY) if request.sub_resource else ("",)
        found: dict[int, CompiledPolicy] = {}
        for key in itertools.product((request.group, _ANY), (request.resource, _ANY), subresources,
                                     (request.operation, _ANY)):
            for order, policy, rule in self._index.get(key, ()):
                if order not in found and (_ANY in rule.api_versions or request.version in rule.api_versions):
                    found[order] = policy
        return [found[order] for order in sorted(found)]


def _rule_keys(rule: ResourceRule) -> Iterator[_Key]:
    """Index keys of a rule; "pods" is the main resource only, "pods/*" its subresources only."""
    for group, resource, operation in itertools.product(rule.api_groups, rule.resources, rule.operations):
        main, _, sub = resource.partition("/")
        yield group, main, sub, operation
