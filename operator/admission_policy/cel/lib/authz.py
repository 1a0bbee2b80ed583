"""Kubernetes' authz library: ``authorizer.group('').resource('pods').namespace(n).check('delete')``.

The values are opaque (``kubernetes.authorization.*``, see ``types``), each holding the check
built so far as canonical JSON: the subject, then group, resource, subresource, namespace, name,
selectors or path. ``check(verb)`` completes it and asks the evaluation's authorization for the
answer (``authorization.ask``): the engine supplies the answers, this module never calls anyone.

As in Kubernetes: ``path`` and ``resource`` refuse a blank string (Go's ``strings.TrimSpace``);
``serviceAccount`` checks the name (a DNS subdomain) before the namespace (a DNS label) and
checks as that account (its username and the two service-account groups); ``subresource``,
``namespace`` and ``name`` of "" mean unset; a field or label selector that does not parse
limits nothing (the API server, which parses it, ignores it); ``check`` takes any verb.
``fieldSelector`` and ``labelSelector`` are Kubernetes' AuthzSelectors library (1.31).

The engine binds ``authorizer`` (the requester, from ``request.userInfo``) and
``authorizer.requestResource`` (the request's own resource as a resource check: ``bindings``).
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from cel_expr_python import cel

from ...authorization import Answer, Check, Subject, ask
from .library import Library, function, overload
from .types import opaque

AUTHORIZER: Final = opaque("kubernetes.authorization.Authorizer")
PATH_CHECK: Final = opaque("kubernetes.authorization.PathCheck")
GROUP_CHECK: Final = opaque("kubernetes.authorization.GroupCheck")
RESOURCE_CHECK: Final = opaque("kubernetes.authorization.ResourceCheck")
DECISION: Final = opaque("kubernetes.authorization.Decision")

# What Go's unicode.IsSpace calls a space (Python's str.strip() also strips \x1c-\x1f).
_GO_SPACE: Final = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009" \
                   "\u200a\u2028\u2029\u202f\u205f\u3000"
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _state(data: Any) -> str:
    # ASCII: a request's strings may hold lone surrogates (JSON allows "\ud800"), which UTF-8 cannot.
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _subject(value: Any) -> Subject:
    return Subject.from_json(json.loads(AUTHORIZER.state(value)))


def _check(value: Any) -> Check:
    return Check.from_json(json.loads(str(value.state)))


def _with(value: Any, result: Any, **changes: str) -> Any:
    """A check value of type ``result``: the check of ``value`` with ``changes`` (its fields)."""
    return result.of(_state({**json.loads(str(value.state)), **changes}))


def authorizer_of(subject: Subject) -> Any:
    """CEL's ``authorizer`` acting as ``subject``: its checks are asked of the evaluation's
    ``Authorization``, never of the API server directly."""
    return AUTHORIZER.of(_state(subject.to_json()))


def bindings(request: Mapping[str, Any]) -> dict[str, Any]:
    """``authorizer`` and ``authorizer.requestResource`` for an AdmissionReview's ``request``.

    The request's own resource is ``requestResource``/``requestSubResource`` (the resource as
    the client asked for it, which Kubernetes' in-process check uses), else ``resource``."""
    subject = Subject.of(request.get("userInfo"))
    asked = request.get("requestResource")
    found: Any
    if isinstance(asked, Mapping):
        found, subresource = asked, request.get("requestSubResource")
    else:
        found, subresource = request.get("resource"), request.get("subResource")
    resource: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    check = Check(subject, "", group=_text(resource.get("group")), resource=_text(resource.get("resource")),
                  subresource=_text(subresource), namespace=_text(request.get("namespace")),
                  name=_text(request.get("name")))
    return {"authorizer": authorizer_of(subject),
            "authorizer.requestResource": RESOURCE_CHECK.of(_state(check.to_json()))}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _blank(text: str) -> bool:
    return not text.strip(_GO_SPACE)


def _path(authorizer: Any, path: str) -> Any:
    if _blank(path):
        raise ValueError("path must not be empty")
    return PATH_CHECK.of(_state(Check(_subject(authorizer), "", path=path).to_json()))


def _group(authorizer: Any, group: str) -> Any:
    return GROUP_CHECK.of(_state(Check(_subject(authorizer), "", group=group).to_json()))


def _service_account(authorizer: Any, namespace: str, name: str) -> Any:
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError("Invalid service account name")
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise ValueError("Invalid service account namespace")
    return authorizer_of(Subject.service_account(namespace, name))


def _resource(group_check: Any, resource: str) -> Any:
    if _blank(resource):
        raise ValueError("resource must not be empty")
    return _with(group_check, RESOURCE_CHECK, resource=resource)


def _setter(field: str) -> Callable[[Any, str], Any]:
    """``subresource``, ``namespace``, ``name`` and the selectors: set as given ("" unsets)."""
    return lambda resource_check, value: _with(resource_check, RESOURCE_CHECK, **{field: value})


def _decide(check_value: Any, verb: str) -> Any:
    answer = ask(dataclasses.replace(_check(check_value), verb=verb))
    return DECISION.of(_state(dataclasses.asdict(answer)))


def _answer(decision: Any) -> Answer:
    return Answer(**json.loads(DECISION.state(decision)))


_S, _B = cel.Type.STRING, cel.Type.BOOL

LIBRARY = Library("authz", "1.27", functions=(
    function("path", overload("authorizer_path", PATH_CHECK.type, [AUTHORIZER.type, _S], _path, member=True)),
    function("group", overload("authorizer_group", GROUP_CHECK.type, [AUTHORIZER.type, _S], _group, member=True)),
    function("serviceAccount", overload("authorizer_serviceaccount", AUTHORIZER.type, [AUTHORIZER.type, _S, _S],
                                        _service_account, member=True)),
    function("resource", overload("groupcheck_resource", RESOURCE_CHECK.type, [GROUP_CHECK.type, _S], _resource,
                                  member=True)),
    *(function(name, overload(f"resourcecheck_{name}", RESOURCE_CHECK.type, [RESOURCE_CHECK.type, _S],
                              _setter(name), member=True))
      for name in ("subresource", "namespace", "name")),
    function("fieldSelector", overload("authorizer_fieldselector", RESOURCE_CHECK.type, [RESOURCE_CHECK.type, _S],
                                       _setter("field_selector"), member=True)),
    function("labelSelector", overload("authorizer_labelselector", RESOURCE_CHECK.type, [RESOURCE_CHECK.type, _S],
                                       _setter("label_selector"), member=True)),
    function("check",
             overload("pathcheck_check", DECISION.type, [PATH_CHECK.type, _S], _decide, member=True),
             overload("resourcecheck_check", DECISION.type, [RESOURCE_CHECK.type, _S], _decide, member=True)),
    function("allowed", overload("decision_allowed", _B, [DECISION.type], lambda d: _answer(d).allowed,
                                 member=True)),
    function("reason", overload("decision_reason", _S, [DECISION.type], lambda d: _answer(d).reason, member=True)),
    function("errored", overload("decision_errored", _B, [DECISION.type], lambda d: bool(_answer(d).error),
                                 member=True)),
    function("error", overload("decision_error", _S, [DECISION.type], lambda d: _answer(d).error, member=True)),
), summary="authorizer checks: authorizer.group(g).resource(r)….check(verb).allowed(), path(p), serviceAccount(ns, "
           "name), authorizer.requestResource; fieldSelector/labelSelector since 1.31")
