"""Declared authorizer answers: how ``test``, ``review`` and ``audit`` answer a policy's
``authorizer`` checks without a cluster.

A test case (or its whole suite) lists them under ``authorizer:``, inline or as files; the
commands take ``--authorizer FILE``. Each answer says what it covers — ``user`` or
``serviceAccount`` (``namespace/name``), ``verb``, and either ``path`` (a non-resource check) or
any of ``group``, ``resource``, ``subresource``, ``namespace``, ``name``, ``fieldSelector``,
``labelSelector`` (a resource check); a field left out covers every value — and what the
authorizer decides: ``allowed`` (required), ``reason``, ``error`` (an authorizer error: then
``errored()`` is true). The first answer that covers a check answers it.

A check no answer covers is refused (exit 2, or the case cannot run), naming the check: any
guess, allowed or not, would make a test pass that the cluster may fail.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from ..authorization import SERVICE_ACCOUNT_PREFIX, Answer, Check, Unanswered
from ..engine import Decision
from .documents import DocumentError, read_documents

# Answer field → the check's attribute it must equal.
_RESOURCE_FIELDS: Final = {"group": "group", "resource": "resource", "subresource": "subresource",
                           "namespace": "namespace", "name": "name", "fieldSelector": "field_selector",
                           "labelSelector": "label_selector"}
_FIELDS: Final = frozenset({"user", "serviceAccount", "verb", "path", *_RESOURCE_FIELDS, "allowed", "reason", "error"})
HINT: Final = "declare an answer for it (a test case's or suite's `authorizer`, or --authorizer FILE)"


@dataclasses.dataclass(frozen=True)
class DeclaredAnswer:
    """One declared answer: the attributes a check must have to be covered, and the decision."""
    where: str
    required: tuple[tuple[str, str], ...]    # (attribute of Check, value); "user" is the subject's
    kind: str                                # "path", "resource", or "" for both
    answer: Answer

    def covers(self, check: Check) -> bool:
        if self.kind and (self.kind == "path") != check.is_path:
            return False
        return all((check.subject.user if key == "user" else getattr(check, key)) == value
                   for key, value in self.required)


@dataclasses.dataclass(frozen=True)
class DeclaredAnswers:
    """The engine's ``Authorization`` offline: the first declared answer that covers a check;
    None (the check is unanswered) when none does."""
    answers: tuple[DeclaredAnswer, ...] = ()

    def answer(self, check: Check) -> Answer | None:
        return next((declared.answer for declared in self.answers if declared.covers(check)), None)


def parse_answers(items: Any, where: str, base: Path | None = None) -> DeclaredAnswers:
    """A list of answers; with ``base``, an item may also be a file of them (relative to it)."""
    if not isinstance(items, list):
        raise DocumentError(f"{where} must be a list of authorizer answers" + (" or files" if base else ""))
    found: list[DeclaredAnswer] = []
    for index, item in enumerate(items):
        if isinstance(item, str) and base is not None:
            found += read_answers(base / item).answers
        else:
            found.append(parse_answer(item, f"{where}[{index}]"))
    return DeclaredAnswers(tuple(found))


def read_answers(path: Path | str) -> DeclaredAnswers:
    """A file's answers: each document a list of answers, or one answer."""
    found: list[DeclaredAnswer] = []
    for document in read_documents(path, allow_empty=False):
        body = document.body
        found += parse_answers(body if isinstance(body, list) else [body], document.source).answers
    return DeclaredAnswers(tuple(found))


def combined(answers: Iterable[DeclaredAnswers]) -> DeclaredAnswers:
    return DeclaredAnswers(tuple(declared for group in answers for declared in group.answers))


def parse_answer(item: Any, where: str) -> DeclaredAnswer:
    if not isinstance(item, Mapping):
        raise DocumentError(f"{where}: an authorizer answer must be an object (user, verb, resource, …, allowed)")
    unknown = sorted(set(map(str, item)) - _FIELDS)
    if unknown:
        raise DocumentError(f"{where}: unknown field {unknown[0]!r} in an authorizer answer "
                            f"(allowed: {', '.join(sorted(_FIELDS))})")
    if not isinstance(item.get("allowed"), bool):
        raise DocumentError(f"{where}.allowed is required (true or false)")
    for key, value in item.items():
        if key != "allowed" and not isinstance(value, str):
            raise DocumentError(f"{where}.{key} must be a string")
    if "user" in item and "serviceAccount" in item:
        raise DocumentError(f"{where}: give user or serviceAccount, not both")
    required = [(attribute, item[key]) for key, attribute in (("verb", "verb"), ("path", "path"),
                                                              *_RESOURCE_FIELDS.items()) if key in item]
    if "user" in item:
        required.append(("user", item["user"]))
    if "serviceAccount" in item:
        namespace, slash, name = item["serviceAccount"].partition("/")
        if not slash or not namespace or not name or "/" in name:
            raise DocumentError(f"{where}.serviceAccount must be namespace/name, got {item['serviceAccount']!r}")
        required.append(("user", f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"))
    resource = sorted(key for key in _RESOURCE_FIELDS if key in item)
    if "path" in item and resource:
        raise DocumentError(f"{where}: path is for non-resource checks, {resource[0]} for resource checks: not both")
    kind = "path" if "path" in item else "resource" if resource else ""
    answer = Answer(item["allowed"], item.get("reason", ""), item.get("error", ""))
    return DeclaredAnswer(where, tuple(required), kind, answer)


def answered(decision: Decision) -> Decision:
    """The decision, unless the evaluation stopped for checks no declared answer covers."""
    if decision.unanswered:
        raise DocumentError(f"{Unanswered(decision.unanswered)}: {HINT}")
    return decision
