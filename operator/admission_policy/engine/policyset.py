"""An immutable, indexed set of compiled policies.

The index maps (group, resource, subresource, operation) to the policies whose rules name them,
so a request costs a handful of dict lookups however many policies are installed, and a
request that no rule names evaluates no CEL at all. The cluster's policies have one index, and
each namespace's tenant policies (NamespacedAdmissionPolicy) one of their own, so that a request
meets the cluster's and its own namespace's, never the thousand other tenants'. An update
returns a new set that shares everything but the changed policy's index, so loading N policies
one by one stays linear.

A policy Kubernetes enforces itself (``vap/native.py``) stays in the set, for the background
audit, but ``scoped`` gives the webhooks a view in which it judges only the namespaces its
generated objects leave to them.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from ..api import ResourceRule, split_resource
from .compiler import CompiledPolicy
from .request import AdmissionRequest

_Key = tuple[str, str, str, str]  # group, resource, subresource, operation ("*" = any)
_Entry = tuple[CompiledPolicy, ResourceRule]
_Index = dict[_Key, tuple[_Entry, ...]]
_Indexes = dict[str, _Index]   # "": the cluster's policies; a namespace: its tenant policies

_ANY: Final = "*"


class PolicySet:
    """Policies in name order, with candidate lookup by what a request addresses."""

    def __init__(self, policies: Iterable[CompiledPolicy] = ()) -> None:
        self._policies: dict[str, CompiledPolicy] = {}
        self._indexes: _Indexes = {}
        self._scopes: Mapping[str, frozenset[str]] = {}
        for policy in policies:
            if policy.name in self._policies:
                raise ValueError(f"policy names must be unique in a PolicySet: {policy.name!r}")
            self._policies[policy.name] = policy
            _add(self._indexes.setdefault(_namespace(policy), {}), policy)

    @classmethod
    def _of(cls, policies: dict[str, CompiledPolicy], indexes: _Indexes) -> PolicySet:
        new = cls()
        new._policies, new._indexes = policies, indexes
        return new

    @functools.cached_property
    def _ordered(self) -> tuple[CompiledPolicy, ...]:
        return tuple(self._policies[name] for name in sorted(self._policies))

    def __len__(self) -> int:
        return len(self._policies)

    def __iter__(self) -> Iterator[CompiledPolicy]:
        return iter(self._ordered)

    def __contains__(self, name: object) -> bool:
        return name in self._policies

    def get(self, name: str) -> CompiledPolicy | None:
        return self._policies.get(name)

    def scoped(self, scopes: Mapping[str, frozenset[str]]) -> PolicySet:
        """The same policies, but those named in ``scopes`` judge only requests in the namespaces
        given (none: no request at all): what the webhooks judge while Kubernetes enforces them."""
        view = PolicySet._of(self._policies, self._indexes)
        view._scopes = {name: scope for name, scope in scopes.items() if name in self._policies}
        return view

    def scope(self, name: str) -> frozenset[str] | None:
        """The namespaces a scoped policy judges here (None: it is not scoped, it judges all)."""
        return self._scopes.get(name)

    def replace(self, policy: CompiledPolicy) -> PolicySet:
        """A new set with this policy added or replacing the one of the same name."""
        policies, indexes = dict(self._policies), dict(self._indexes)
        old = policies.get(policy.name)
        for namespace in {_namespace(one) for one in (policy, old) if one is not None}:
            indexes[namespace] = dict(indexes.get(namespace, {}))   # copied: the old set keeps its own
        if old is not None:
            _discard(indexes, old)
        policies[policy.name] = policy
        _add(indexes.setdefault(_namespace(policy), {}), policy)
        return PolicySet._of(policies, indexes)

    def remove(self, name: str) -> PolicySet:
        """A new set without the policy ``name`` (this one, when it has none)."""
        if name not in self._policies:
            return self
        policies, indexes = dict(self._policies), dict(self._indexes)
        old = policies.pop(name)
        indexes[_namespace(old)] = dict(indexes[_namespace(old)])
        _discard(indexes, old)
        return PolicySet._of(policies, indexes)

    def candidates(self, request: AdmissionRequest) -> list[CompiledPolicy]:
        """Policies with a rule naming this request's resource, operation and version, by name:
        the cluster's, and the tenant policies of the request's namespace."""
        indexes = [index for index in (self._indexes.get(""), self._indexes.get(request.namespace)
                                       if request.namespace else None) if index]
        if not indexes:
            return []
        subresources = (request.sub_resource, _ANY) if request.sub_resource else ("",)
        found: dict[str, CompiledPolicy] = {}
        for key in itertools.product((request.group, _ANY), (request.resource, _ANY), subresources,
                                     (request.operation, _ANY)):
            for index in indexes:
                for policy, rule in index.get(key, ()):
                    if policy.name not in found and (_ANY in rule.api_versions or request.version in rule.api_versions):
                        found[policy.name] = policy
        if self._scopes:
            for name in [name for name in found if name in self._scopes]:
                if request.namespace not in self._scopes[name]:
                    del found[name]
        return [found[name] for name in sorted(found)]


def _namespace(policy: CompiledPolicy) -> str:
    return policy.policy.namespace or ""


def _keys(rule: ResourceRule) -> Iterator[_Key]:
    """Index keys of a rule; "pods" is the main resource only, "pods/*" its subresources only."""
    for group, resource, operation in itertools.product(rule.api_groups, rule.resources, rule.operations):
        yield (group, *split_resource(resource), operation)


def _entries(policy: CompiledPolicy) -> Iterator[_Entry]:
    """A policy's rules, and those of the policies derived from it for Pod controllers (their
    resources never overlap: see ``podcontrollers.already_matched``)."""
    for compiled in (policy, *policy.derived):
        for rule in compiled.policy.match.resources:
            yield compiled, rule


def _add(index: _Index, policy: CompiledPolicy) -> None:
    for compiled, rule in _entries(policy):
        for key in _keys(rule):
            index[key] = (*index.get(key, ()), (compiled, rule))


def _discard(indexes: _Indexes, policy: CompiledPolicy) -> None:
    """Take the policy out of its (already copied) index; an index left empty goes."""
    index = indexes[_namespace(policy)]
    mine = {id(compiled) for compiled in (policy, *policy.derived)}
    for _, rule in _entries(policy):
        for key in _keys(rule):
            kept = tuple(entry for entry in index.get(key, ()) if id(entry[0]) not in mine)
            if kept:
                index[key] = kept
            else:
                index.pop(key, None)
    if not index:
        del indexes[_namespace(policy)]
