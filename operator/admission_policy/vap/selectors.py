"""Label selectors: both of two at once, as an AdmissionPolicy writes one, and as CEL.

A request must match the namespaceSelector of the policy and that of its binding. Both read the
same labels (the namespace's), so their conjunction is one selector with the requirements of
both. Object selectors are another matter: each holds when the new *or* the old object's labels
match, so two of them are not one selector on an UPDATE that relabels; the second becomes CEL.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Final

from .rules import quote

OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` item, as the API server accepts it (``values`` empty for
    Exists and DoesNotExist)."""
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Selector:
    """A Kubernetes LabelSelector; the empty one matches everything."""
    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.labels and not self.expressions

    def as_yaml(self) -> dict[str, Any]:
        """The selector as an object writes it (empty parts left out)."""
        body: dict[str, Any] = {}
        if self.labels:
            body["matchLabels"] = dict(self.labels)
        if self.expressions:
            body["matchExpressions"] = [
                {"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
                for r in self.expressions]
        return body


def both(a: Selector, b: Selector) -> Selector:
    """One selector matching the labels both match. A key both fix to different values stays a
    requirement of its own (`key In [value]`): then nothing matches, as with the two selectors."""
    labels = dict(a.labels)
    extra: list[Requirement] = []
    for key, value in b.labels:
        if key not in labels:
            labels[key] = value
        elif labels[key] != value:
            extra.append(Requirement(key, "In", (value,)))
    return Selector(tuple(labels.items()), (*a.expressions, *extra, *b.expressions))


def object_condition(selector: Selector) -> str:
    """CEL for an objectSelector: the new or the old object has labels it matches. A value
    without metadata (the options of a CONNECT) has no labels to match, as in Kubernetes."""
    terms = [f"{quote(key)} in l && l[{quote(key)}] == {quote(value)}" for key, value in selector.labels]
    terms += [_requirement(requirement) for requirement in selector.expressions]
    matches = " && ".join(f"({term})" if " || " in term else term for term in terms) or "true"
    return ("[object, oldObject].exists(o, o != null && has(o.metadata) && "
            f"[o.metadata.?labels.orValue({{}})].exists(l, {matches}))")   # a binding Kubernetes has


def _requirement(requirement: Requirement) -> str:
    key = quote(requirement.key)
    values = f"[{', '.join(quote(value) for value in requirement.values)}]"
    return {
        "In": f"{key} in l && l[{key}] in {values}",
        "NotIn": f"!({key} in l) || !(l[{key}] in {values})",
        "Exists": f"{key} in l",
        "DoesNotExist": f"!({key} in l)",
    }[requirement.operator]
