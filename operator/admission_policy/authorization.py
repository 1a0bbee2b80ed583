"""Authorizer checks as plain data: what a policy's ``authorizer`` asks, and what it was answered.

Kubernetes evaluates ``authorizer.….check(verb)`` by calling its authorizer in the middle of the
CEL evaluation. Here the engine stays pure (no I/O), so an evaluation answers checks from an
``Authorization`` handed to it, like params: a table the webhook fills with SubjectAccessReviews,
or answers declared in a test file. A check it has no answer for yet is *missing*: the CEL call
fails, the evaluation is thrown away, and the caller learns which checks to answer (``Asking``),
answers them and evaluates again. An error CEL absorbs (``false && …``) loses nothing: the result
did not depend on that check.

``answering`` makes an ``Authorization`` the one in effect for the CEL functions
(``cel.lib.authz``) while an evaluation runs, through a context variable: the functions are
registered once per process, and a context variable is what they can see per evaluation.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import dataclasses
import json
import secrets
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final, Protocol

from .errors import AdmissionPolicyError

SERVICE_ACCOUNT_PREFIX: Final = "system:serviceaccount:"
ALL_SERVICE_ACCOUNTS: Final = "system:serviceaccounts"
NO_AUTHORIZER: Final = ("no authorizer is available here: authorizer checks are answered for admission requests, "
                        "and offline from declared answers (a test case's `authorizer`, or --authorizer FILE)")


@dataclasses.dataclass(frozen=True)
class Subject:
    """Whom a check is about: the requester (``request.userInfo``), or a service account.

    Groups and extra values are kept sorted: Kubernetes' per-request cache of decisions takes
    them in any order as the same subject, and so does the table here."""
    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def of(cls, user_info: Any) -> Subject:
        """The requester, from an AdmissionReview's ``request.userInfo`` (anything else: nobody)."""
        info = user_info if isinstance(user_info, Mapping) else {}
        groups = info.get("groups")
        extra = info.get("extra")
        return cls(
            user=_text(info.get("username")),
            groups=tuple(sorted(_text(g) for g in groups)) if isinstance(groups, list) else (),
            uid=_text(info.get("uid")),
            extra=tuple(sorted((str(key), tuple(sorted(_text(v) for v in values)))
                               for key, values in extra.items() if isinstance(values, list)))
            if isinstance(extra, Mapping) else (),
        )

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Subject:
        """What Kubernetes' ``ServiceAccountInfo.UserInfo()`` makes of a namespace and name alone:
        the username and the two service-account groups; no uid, no extra."""
        return cls(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
                   tuple(sorted((ALL_SERVICE_ACCOUNTS, f"{ALL_SERVICE_ACCOUNTS}:{namespace}"))))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, for the CEL values that carry a subject and for checks sent back from a
        child process (``from_json`` reads it)."""
        return {"user": self.user, "groups": list(self.groups), "uid": self.uid,
                "extra": {key: list(values) for key, values in self.extra}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Subject:
        return cls(str(data["user"]), tuple(data["groups"]), str(data["uid"]),
                   tuple((key, tuple(values)) for key, values in data["extra"].items()))


@dataclasses.dataclass(frozen=True)
class Check:
    """One authorization check: Kubernetes' ``AttributesRecord`` as the CEL library fills it.

    A non-resource check has a ``path`` (never empty: ``authorizer.path('')`` is an error) and
    no resource attributes; a resource check has a ``resource`` and no path. The API version is
    always "*". Selectors are kept as written: the API server parses them, and one that does not
    parse limits nothing, there as in Kubernetes' own check."""
    subject: Subject
    verb: str
    path: str = ""
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    field_selector: str = ""
    label_selector: str = ""

    @property
    def is_path(self) -> bool:
        return bool(self.path)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: how a check travels in a CEL value's state and in an error's text."""
        data: dict[str, Any] = dataclasses.asdict(self)
        data["subject"] = self.subject.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Check:
        values = {field.name: str(data[field.name]) for field in dataclasses.fields(cls) if field.name != "subject"}
        return cls(subject=Subject.from_json(data["subject"]), **values)

    def describe(self) -> str:
        """The check as the fields of a declared answer that covers exactly it (JSON, so YAML too)."""
        fields: dict[str, str] = {"user": self.subject.user, "verb": self.verb}
        if self.is_path:
            fields["path"] = self.path
        else:
            fields["group"] = self.group
            for key, value in (("resource", self.resource), ("subresource", self.subresource),
                               ("namespace", self.namespace), ("name", self.name),
                               ("fieldSelector", self.field_selector), ("labelSelector", self.label_selector)):
                if value:
                    fields[key] = value
        return json.dumps(fields, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class Answer:
    """An authorizer's decision: ``allowed`` only on "allow" ("deny" and "no opinion" are both
    false); ``error`` when the authorizer failed (Kubernetes' ``errored()``), whatever else it said."""
    allowed: bool
    reason: str = ""
    error: str = ""


class Authorization(Protocol):
    """Where an evaluation's checks are answered from. Answers from memory, never waiting."""

    def answer(self, check: Check) -> Answer | None:
        """The answer, or None when there is none yet (the caller must ask for it)."""


@dataclasses.dataclass(frozen=True)
class Answers:
    """A table of answers, as the webhook fills it round by round. ``otherwise``: what a check
    not in the table gets; None (the default) asks for it."""
    known: Mapping[Check, Answer] = dataclasses.field(default_factory=dict)
    otherwise: Answer | None = None

    def answer(self, check: Check) -> Answer | None:
        """The table's answer, else ``otherwise``; None means: ask the API server."""
        return self.known.get(check, self.otherwise)


class Unanswered(AdmissionPolicyError):
    """Raised by callers that cannot ask for more answers than they were given."""

    def __init__(self, checks: Iterable[Check]) -> None:
        self.checks = tuple(checks)
        super().__init__("no answer for the authorizer check(s): " + "; ".join(c.describe() for c in self.checks))


@dataclasses.dataclass
class Asking:
    """One evaluation's authorization in effect, and the checks it had no answer for.

    A policy run in a child process (``cel.fork``) records its missing checks in the child's
    memory, which the parent never sees; so the error text of a missing check also carries the
    check, after a token only this evaluation knows (an expression cannot forge it), and
    ``unanswered`` reads it back from the errors the evaluation recorded."""
    authorization: Authorization | None
    missing: dict[Check, None] = dataclasses.field(default_factory=dict)
    token: str = dataclasses.field(default_factory=lambda: secrets.token_hex(8))

    def ask(self, check: Check) -> Answer:
        """The answer to ``check``; ValueError (a CEL error) when there is none."""
        if self.authorization is None:
            raise ValueError(NO_AUTHORIZER)
        answer = self.authorization.answer(check)
        if answer is None:
            self.missing[check] = None
            encoded = base64.urlsafe_b64encode(json.dumps(check.to_json()).encode()).decode()
            raise ValueError(f"authorizer check not answered yet: {check.describe()} [{self.token}:{encoded}]")
        return answer

    def unanswered(self, errors: Iterable[str]) -> tuple[Check, ...]:
        """The checks asked without an answer, in the order asked: those recorded here, and
        those named by ``errors`` (the evaluation's error texts, a child process's included).
        Every request passes here: a plain search, no pattern to compile, when nothing erred."""
        found = dict(self.missing)
        marker = f"[{self.token}:"
        for text in errors:
            start = text.find(marker)
            while start >= 0:
                end = text.find("]", start)
                encoded = text[start + len(marker):end if end >= 0 else len(text)]
                with contextlib.suppress(ValueError, KeyError, TypeError, binascii.Error):
                    found[Check.from_json(json.loads(base64.urlsafe_b64decode(encoded)))] = None
                start = text.find(marker, start + 1)
        return tuple(found)


_CURRENT: contextvars.ContextVar[Asking | None] = contextvars.ContextVar("admission_policy_authorization",
                                                                        default=None)


@contextlib.contextmanager
def answering(authorization: Authorization | None) -> Iterator[Asking]:
    """Make ``authorization`` answer the checks of the CEL evaluations run inside."""
    asking = Asking(authorization)
    token = _CURRENT.set(asking)
    try:
        yield asking
    finally:
        _CURRENT.reset(token)


def ask(check: Check) -> Answer:
    """The answer to ``check`` in the evaluation at hand (``answering``); ValueError if none."""
    asking = _CURRENT.get()
    if asking is None:
        raise ValueError(NO_AUTHORIZER)
    return asking.ask(check)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)
