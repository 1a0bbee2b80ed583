"""Kubernetes' authz CEL library (``authorizer``), its answers offline, and the webhook's rounds.

The attributes each check carries and the decisions' accessors follow Kubernetes' library and
its admission tests (k8s.io/apiserver pkg/cel/library/authz.go, pkg/admission/plugin/cel
condition_test.go); the SubjectAccessReviews are checked against a real API server in
tests/e2e/test_e2e_authorizer.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from celcases import compile_error, evaluate, evaluation_error
from click.testing import CliRunner

import builders
from admission_policy.authorization import (
    NO_AUTHORIZER,
    Answer,
    Answers,
    Asking,
    Authorization,
    Check,
    Subject,
    answering,
)
from admission_policy.cel.lib import authz
from admission_policy.cli import main
from admission_policy.cli.authorizer import DeclaredAnswers, parse_answer, parse_answers
from admission_policy.cli.documents import DocumentError
from admission_policy.operator import authorizer
from builders import CREATE_POD_RULE, decide, pod, policy, policy_body, request

REQUEST: dict[str, Any] = {
    "uid": "1", "operation": "CREATE", "namespace": "default", "name": "endpoints1",
    "resource": {"group": "", "version": "v1", "resource": "endpoints"},
    "userInfo": {"username": "alice", "uid": "u-1", "groups": ["system:authenticated", "devs"],
                 "extra": {"scopes": ["b", "a"]}},
}
ALICE = Subject("alice", ("devs", "system:authenticated"), "u-1", (("scopes", ("a", "b")),))
SERVICE_ACCOUNT = Subject("system:serviceaccount:default:test-serviceaccount",
                          ("system:serviceaccounts", "system:serviceaccounts:default"))


@dataclasses.dataclass
class Recorder:
    """An authorization that answers with ``decide`` and remembers what it was asked."""
    decide: Callable[[Check], Answer | None] = lambda check: Answer(True)
    asked: list[Check] = dataclasses.field(default_factory=list)

    def answer(self, check: Check) -> Answer | None:
        self.asked.append(check)
        return self.decide(check)


def run(source: str, authorization: Any, request: Mapping[str, Any] = REQUEST) -> Any:
    with answering(authorization):
        return evaluate(source, **authz.bindings(request))


def asked(source: str, request: Mapping[str, Any] = REQUEST) -> Check:
    recorder = Recorder()
    run(source, recorder, request)
    (check,) = recorder.asked
    return check


# --- what a check asks -----------------------------------------------------------------------------------

CHECKS = [
    ("authorizer.group('').resource('endpoints').check('create')",
     Check(ALICE, "create", group="", resource="endpoints")),
    ("authorizer.group('apps').resource('deployments').fieldSelector('foo=bar').labelSelector('apple=banana')"
     ".subresource('status').namespace('test').name('backend').check('create')",
     Check(ALICE, "create", group="apps", resource="deployments", subresource="status", namespace="test",
           name="backend", field_selector="foo=bar", label_selector="apple=banana")),
    # A selector that does not parse is passed on as written: the API server ignores it.
    ("authorizer.group('apps').resource('deployments').fieldSelector('foo badoperator bar')"
     ".labelSelector('apple badoperator banana').check('create')",
     Check(ALICE, "create", group="apps", resource="deployments", field_selector="foo badoperator bar",
           label_selector="apple badoperator banana")),
    # "" leaves a field unset; a later call replaces an earlier one.
    ("authorizer.group('').resource('pods').subresource('').namespace('').name('').check('list')",
     Check(ALICE, "list", resource="pods")),
    ("authorizer.group('').resource('pods').namespace('a').namespace('b').check('get')",
     Check(ALICE, "get", resource="pods", namespace="b")),
    ("authorizer.group('example.com').resource('widgets').check('')",
     Check(ALICE, "", group="example.com", resource="widgets")),
    ("authorizer.path('/healthz').check('get')", Check(ALICE, "get", path="/healthz")),
    ("authorizer.path('healthz').check('GET')", Check(ALICE, "GET", path="healthz")),   # no leading / needed
    ("authorizer.path('\\x1c').check('get')", Check(ALICE, "get", path="\x1c")),   # not a space to Go
    ("authorizer.serviceAccount('default', 'test-serviceaccount').group('').resource('endpoints')"
     ".namespace('default').name('endpoints1').check('custom-verb')",
     Check(SERVICE_ACCOUNT, "custom-verb", resource="endpoints", namespace="default", name="endpoints1")),
    ("authorizer.serviceAccount('default', 'test-serviceaccount').path('/metrics').check('get')",
     Check(SERVICE_ACCOUNT, "get", path="/metrics")),
    ("authorizer.requestResource.check('custom-verb')",
     Check(ALICE, "custom-verb", resource="endpoints", namespace="default", name="endpoints1")),
]


@pytest.mark.parametrize(("source", "expected"), CHECKS)
def test_a_check_carries_the_attributes_kubernetes_gives_its_authorizer(source: str, expected: Check) -> None:
    assert asked(source) == expected


REQUESTS = [
    # A subresource request: the subresource is part of the request's own resource.
    ({**REQUEST, "subResource": "status"},
     Check(ALICE, "update", resource="endpoints", subresource="status", namespace="default", name="endpoints1")),
    # Converted for the webhook (matchPolicy: Equivalent): the resource as the client asked for it.
    ({**REQUEST, "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
      "requestResource": {"group": "extensions", "version": "v1beta1", "resource": "deployments"},
      "subResource": "scale", "requestSubResource": "scale"},
     Check(ALICE, "update", group="extensions", resource="deployments", subresource="scale", namespace="default",
           name="endpoints1")),
    # A CREATE whose name the API server generates, of a cluster-scoped resource, by nobody.
    ({"resource": {"group": "", "version": "v1", "resource": "namespaces"}, "name": "", "namespace": ""},
     Check(Subject(""), "update", resource="namespaces")),
]


@pytest.mark.parametrize(("request_body", "expected"), REQUESTS)
def test_request_resource_is_the_request_as_the_client_sent_it(request_body: dict[str, Any],
                                                               expected: Check) -> None:
    assert asked("authorizer.requestResource.check('update')", request_body) == expected


def test_groups_and_extra_in_any_order_are_one_subject() -> None:
    shuffled = {**REQUEST, "userInfo": {**REQUEST["userInfo"], "groups": ["devs", "system:authenticated"],
                                        "extra": {"scopes": ["a", "b"]}}}
    assert asked("authorizer.path('/x').check('get')", shuffled) == asked("authorizer.path('/x').check('get')")


# --- what a decision says ---------------------------------------------------------------------------------

DECISIONS = [
    (Answer(True), {"allowed": True, "reason": "", "errored": False, "error": ""}),
    (Answer(False, "fake reason"), {"allowed": False, "reason": "fake reason", "errored": False, "error": ""}),
    # An authorizer error: errored, and never allowed when it had no opinion.
    (Answer(False, "", "fake authz error"), {"allowed": False, "reason": "", "errored": True,
                                             "error": "fake authz error"}),
    # Kubernetes' union authorizer may allow and report another authorizer's error.
    (Answer(True, "RBAC: allowed", "webhook: timeout"), {"allowed": True, "reason": "RBAC: allowed",
                                                         "errored": True, "error": "webhook: timeout"}),
]


@pytest.mark.parametrize(("answer", "accessors"), DECISIONS)
@pytest.mark.parametrize("check", ["authorizer.group('').resource('endpoints').check('create')",
                                   "authorizer.path('/healthz').check('get')"])
def test_decision_accessors(answer: Answer, accessors: dict[str, Any], check: str) -> None:
    for accessor, expected in accessors.items():
        assert run(f"{check}.{accessor}()", Answers(otherwise=answer)) == expected


def test_each_distinct_check_is_asked_and_a_decision_is_a_value() -> None:
    recorder = Recorder(lambda check: Answer(check.verb == "get"))
    result = run("[authorizer.path('/a').check('get').allowed(), authorizer.path('/a').check('put').allowed(), "
                 "authorizer.path('/a').check('get') == authorizer.path('/a').check('get')]", recorder)
    assert result == [True, False, True]
    assert {check.verb for check in recorder.asked} == {"get", "put"}


# --- errors ------------------------------------------------------------------------------------------------

ERRORS = [
    ("authorizer.path('').check('get')", "path must not be empty"),
    ("authorizer.path('  ').check('get')", "path must not be empty"),
    ("authorizer.path('\\t\\n\\u00a0\\u3000').check('get')", "path must not be empty"),
    ("authorizer.group('apps').resource('').check('get')", "resource must not be empty"),
    ("authorizer.group('apps').resource('  ').check('get')", "resource must not be empty"),
    ("authorizer.serviceAccount('not@a#valid!namespace', 'validname')", "Invalid service account namespace"),
    # The name is checked first (the namespace here is no DNS label either).
    ("authorizer.serviceAccount('valid.example.com', 'invalid@*name')", "Invalid service account name"),
    ("authorizer.serviceAccount('default', '')", "Invalid service account name"),
    ("authorizer.serviceAccount('default', 'Upper')", "Invalid service account name"),
    ("authorizer.serviceAccount('default', '" + "a" * 254 + "')", "Invalid service account name"),
    ("authorizer.serviceAccount('', 'sa')", "Invalid service account namespace"),
    ("authorizer.serviceAccount('my.namespace', 'sa')", "Invalid service account namespace"),
    ("authorizer.serviceAccount('" + "a" * 64 + "', 'sa')", "Invalid service account namespace"),
]


@pytest.mark.parametrize(("source", "message"), ERRORS)
def test_refused_arguments_are_kubernetes_errors(source: str, message: str) -> None:
    with answering(Answers(otherwise=Answer(True))):
        assert evaluation_error(source, **authz.bindings(REQUEST)) == message


@pytest.mark.parametrize("source", [
    "authorizer.serviceAccount('default', 'my.service-account').path('/x').check('get').allowed()",
    "authorizer.serviceAccount('" + "a" * 63 + "', '" + ".".join(["b" * 63] * 4)[:253] + "').path('/x')"
    ".check('get').allowed()",
])
def test_service_account_names_at_the_limits_are_accepted(source: str) -> None:
    assert run(source, Answers(otherwise=Answer(True))) is True


@pytest.mark.parametrize("source", [
    "'x'.check('get')",
    "authorizer.group('').check('get')",
    "authorizer.resource('pods')",
    "authorizer.path('/x').namespace('y')",
    "authorizer.requestResource.resource('pods')",
    "authorizer.path('/x').check(1)",
    "authorizer.group('').resource('pods').check('get').allowed() + 1",
])
def test_calls_of_the_wrong_type_do_not_compile(source: str) -> None:
    assert "found no matching overload" in compile_error(source)


def test_without_an_authorization_a_check_is_an_error() -> None:
    assert evaluation_error("authorizer.path('/x').check('get').allowed()", **authz.bindings(REQUEST)) \
        == NO_AUTHORIZER
    with answering(None):
        assert evaluation_error("authorizer.path('/x').check('get').allowed()",
                                **authz.bindings(REQUEST)) == NO_AUTHORIZER


# --- the engine: a check without an answer stops the evaluation ----------------------------------------------

POD = pod(namespace="team-a")
DELETE_PODS = "authorizer.group('').resource('pods').namespace(object.metadata.namespace).check('delete')"
POD_REQUEST = request(POD, name="web", namespace="team-a",
                      user_info={"username": "alice", "groups": ["system:authenticated"]})


USER = Subject("alice", ("system:authenticated",))
DELETE = Check(USER, "delete", resource="pods", namespace="team-a")
ESCALATE = Check(USER, "escalate", resource="pods", namespace="team-a", name="web")
TWO_CHECKS = policy("authz", rules=[CREATE_POD_RULE], validations=[
    {"expression": f"{DELETE_PODS}.allowed()", "message": "may not delete pods"},
    {"expression": "!authorizer.requestResource.check('escalate').allowed()", "message": "escalates"}])


def test_checks_without_answers_are_listed_instead_of_a_decision() -> None:
    decision = decide(TWO_CHECKS, POD_REQUEST, authorization=Answers())
    assert decision.unanswered == (DELETE, ESCALATE)
    assert not decision.allowed and decision.code == 500   # a caller that does not look denies
    assert decision.message.startswith("authorizer checks without an answer: ")


@pytest.mark.parametrize(("delete", "escalate", "allowed", "message"), [
    (Answer(True), Answer(False), True, ""),
    (Answer(False, "no RBAC rule"), Answer(False), False, "may not delete pods"),
    (Answer(True), Answer(True), False, "escalates"),
    # An authorizer error is a decision, not an evaluation error: allowed() is false.
    (Answer(False, error="webhook authorizer timed out"), Answer(False), False, "may not delete pods"),
])
def test_answered_checks_decide(delete: Answer, escalate: Answer, allowed: bool, message: str) -> None:
    decision = decide(TWO_CHECKS, POD_REQUEST, authorization=Answers({DELETE: delete, ESCALATE: escalate}))
    assert decision.unanswered == ()
    assert decision.allowed is allowed
    assert message in decision.message


def test_a_policy_without_checks_never_stops() -> None:
    plain = policy("authz", rules=[CREATE_POD_RULE], validations=[{"expression": "object.metadata.name == 'web'"}])
    decision = decide(plain, POD_REQUEST, authorization=Answers())
    assert decision.allowed and decision.unanswered == ()


def test_without_an_authorization_a_check_is_the_policys_evaluation_error() -> None:
    decision = decide(TWO_CHECKS, POD_REQUEST)
    assert decision.unanswered == () and not decision.allowed
    assert NO_AUTHORIZER in decision.message


def test_a_missing_check_is_read_back_from_the_error_of_a_child_process() -> None:
    """A policy run apart (cel.fork) records its checks in the child; the error text brings them back,
    and only to the evaluation that made them."""
    with answering(Answers()) as asking:
        message = evaluation_error("authorizer.path('/x').check('get').allowed()", **authz.bindings(REQUEST))
    asking.missing.clear()   # as in the parent of the child that asked
    check = Check(ALICE, "get", path="/x")
    assert asking.unanswered([f"spec.validations[0].expression: {message} (hint)"]) == (check,)
    assert Asking(Answers()).unanswered([message]) == ()   # another evaluation's token: forged


# --- the webhook's rounds, with an in-process answerer --------------------------------------------------------

def chain(verbs: Sequence[str]) -> str:
    """Each check made only when the one before allowed: one more round per check."""
    source = "true"
    for verb in reversed(verbs):
        source = f"(authorizer.path('/x').check('{verb}').allowed() ? {source} : false)"
    return source


@dataclasses.dataclass
class Answerer:
    decide: Callable[[Check], Answer]
    rounds: list[list[str]] = dataclasses.field(default_factory=list)

    async def __call__(self, checks: Sequence[Check]) -> Mapping[Check, Answer]:
        self.rounds.append([check.verb for check in checks])
        return {check: self.decide(check) for check in checks}


async def rounds_of(source: str, answerer: Answerer, message: str | None = None) -> Any:
    validation: dict[str, Any] = {"expression": source, "message": "denied"}
    if message is not None:
        validation["messageExpression"] = message
    compiled = policy("authz", rules=[CREATE_POD_RULE], validations=[validation])

    async def judged(answers: Authorization) -> Any:
        return decide(compiled, POD_REQUEST, authorization=answers)
    return await authorizer.decide(judged, answerer)


async def test_checks_that_depend_on_answers_take_a_round_each() -> None:
    answerer = Answerer(lambda check: Answer(True))
    decision = await rounds_of(chain(["a", "b", "c"]), answerer)
    assert decision.allowed
    assert answerer.rounds == [["a"], ["b"], ["c"]]


async def test_independent_checks_are_asked_together_and_once() -> None:
    answerer = Answerer(lambda check: Answer(check.verb != "b"))
    source = ("authorizer.path('/x').check('a').allowed() && authorizer.path('/x').check('b').allowed() "
              "&& authorizer.path('/x').check('a').allowed()")
    decision = await rounds_of(source, answerer)
    assert not decision.allowed and "denied" in decision.message
    assert answerer.rounds == [["a", "b"]]


async def test_a_policy_without_checks_asks_nothing() -> None:
    answerer = Answerer(lambda check: Answer(True))
    assert (await rounds_of("true", answerer)).allowed
    assert answerer.rounds == []


async def test_checks_beyond_the_last_round_are_authorizer_errors() -> None:
    verbs = [f"v{i}" for i in range(authorizer.MAX_ROUNDS + 1)]
    answerer = Answerer(lambda check: Answer(True))
    decision = await rounds_of(chain(verbs), answerer, message=f"authorizer.path('/x').check('{verbs[-1]}').error()")
    assert len(answerer.rounds) == authorizer.MAX_ROUNDS
    assert not decision.allowed
    assert f"asked for checks in more than {authorizer.MAX_ROUNDS} rounds" in decision.message


# --- SubjectAccessReviews -----------------------------------------------------------------------------------

REVIEWS = [
    (Check(ALICE, "delete", group="apps", resource="deployments", subresource="scale", namespace="team-a",
           name="web", field_selector="spec.replicas=1", label_selector="app=web"),
     {"user": "alice", "groups": ["devs", "system:authenticated"], "uid": "u-1", "extra": {"scopes": ["a", "b"]},
      "resourceAttributes": {"verb": "delete", "group": "apps", "version": "*", "resource": "deployments",
                             "subresource": "scale", "namespace": "team-a", "name": "web",
                             "fieldSelector": {"rawSelector": "spec.replicas=1"},
                             "labelSelector": {"rawSelector": "app=web"}}}),
    (Check(SERVICE_ACCOUNT, "list", resource="pods"),
     {"user": SERVICE_ACCOUNT.user, "groups": list(SERVICE_ACCOUNT.groups),
      "resourceAttributes": {"verb": "list", "group": "", "version": "*", "resource": "pods"}}),
    (Check(Subject("bob"), "get", path="/healthz"),
     {"user": "bob", "groups": [], "nonResourceAttributes": {"path": "/healthz", "verb": "get"}}),
]


@pytest.mark.parametrize(("check", "spec"), REVIEWS)
def test_a_review_asks_what_the_check_asks(check: Check, spec: dict[str, Any]) -> None:
    assert authorizer.review_body(check) == {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                             "spec": spec}


ANSWERS = [
    ((201, {"status": {"allowed": True, "reason": "RBAC: allowed by ClusterRoleBinding \"x\""}}),
     Answer(True, 'RBAC: allowed by ClusterRoleBinding "x"')),
    ((201, {"status": {"allowed": False, "denied": True, "reason": "denied by policy"}}),
     Answer(False, "denied by policy")),
    ((201, {"status": {"allowed": False}}), Answer(False)),
    ((201, {"status": {"allowed": False, "evaluationError": "webhook: connection refused"}}),
     Answer(False, "", "webhook: connection refused")),
    ((403, {"message": 'subjectaccessreviews.authorization.k8s.io is forbidden: User "op" cannot create'}),
     Answer(False, "", 'SubjectAccessReview failed: 403 subjectaccessreviews.authorization.k8s.io is forbidden: '
                       'User "op" cannot create')),
    ((503, {"message": "cannot reach the API server: refused"}),
     Answer(False, "", "SubjectAccessReview failed: 503 cannot reach the API server: refused")),
    ((201, "not an object"), Answer(False, "", "SubjectAccessReview failed: 201")),
]


@pytest.mark.parametrize(("reply", "expected"), ANSWERS)
async def test_a_review_answer_becomes_a_decision(monkeypatch: pytest.MonkeyPatch, reply: tuple[int, Any],
                                                  expected: Answer) -> None:
    async def call_json(api: Any, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        assert (method, path) == ("POST", authorizer.REVIEWS_PATH)
        return reply
    monkeypatch.setattr(authorizer, "call_json", call_json)
    assert await authorizer.review(None, DELETE) == expected


async def test_a_client_failure_is_an_authorizer_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def call_json(*args: Any, **kwargs: Any) -> tuple[int, Any]:
        raise RuntimeError("boom")
    monkeypatch.setattr(authorizer, "call_json", call_json)
    assert await authorizer.review(None, DELETE) == Answer(False, "", "SubjectAccessReview failed: RuntimeError: boom")


async def test_reviews_are_bounded_by_the_deadline_and_in_number(monkeypatch: pytest.MonkeyPatch) -> None:
    async def call_json(api: Any, method: str, path: str, *, body: Any) -> tuple[int, Any]:
        if body["spec"]["nonResourceAttributes"]["verb"] == "slow":
            await asyncio.sleep(60)
        return 201, {"status": {"allowed": True}}
    monkeypatch.setattr(authorizer, "call_json", call_json)
    checks = [Check(ALICE, verb, path="/x") for verb in ("fast", "slow", "late")]
    started = time.monotonic()
    answers = await authorizer.review_all(None, checks, time.monotonic() + 0.4, room=2)
    assert time.monotonic() - started < 1.0   # half of what was left, not the slow review's minute
    assert answers[checks[0]] == Answer(True)
    assert answers[checks[1]].error == "the SubjectAccessReview had no answer before the request's deadline"
    assert answers[checks[2]].error == (f"authorization check not made: more than {authorizer.MAX_REVIEWS} distinct "
                                        "checks for one request")
    assert not answers[checks[1]].allowed and not answers[checks[2]].allowed


async def test_a_request_makes_at_most_max_reviews(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    async def call_json(api: Any, method: str, path: str, *, body: Any) -> tuple[int, Any]:
        made.append(body["spec"]["nonResourceAttributes"]["verb"])
        return 201, {"status": {"allowed": True}}
    monkeypatch.setattr(authorizer, "call_json", call_json)
    answer = authorizer.reviewer(None, time.monotonic() + 10)
    first = await answer([Check(ALICE, f"a{i}", path="/x") for i in range(authorizer.MAX_REVIEWS - 1)])
    second = await answer([Check(ALICE, f"b{i}", path="/x") for i in range(2)])
    assert len(made) == authorizer.MAX_REVIEWS and all(a.allowed for a in first.values())
    assert [a.allowed for a in second.values()] == [True, False]


# --- declared answers (offline) -------------------------------------------------------------------------------

COVERS = [
    ({"verb": "delete", "resource": "pods", "allowed": True}, DELETE, True),
    ({"verb": "delete", "resource": "pods", "allowed": True}, ESCALATE, False),
    ({"user": "alice", "allowed": True}, ESCALATE, True),   # a field left out covers every value
    ({"user": "bob", "allowed": True}, ESCALATE, False),
    ({"group": "", "namespace": "team-a", "allowed": True}, DELETE, True),
    ({"group": "apps", "allowed": True}, DELETE, False),
    ({"name": "", "allowed": True}, DELETE, True),           # "" is a value: the check names no object
    ({"name": "", "allowed": True}, ESCALATE, False),
    ({"resource": "pods", "allowed": True}, Check(USER, "get", path="/pods"), False),   # resource checks only
    ({"path": "/healthz", "allowed": True}, Check(USER, "get", path="/healthz"), True),
    ({"path": "/healthz", "allowed": True}, DELETE, False),
    ({"verb": "get", "allowed": True}, Check(USER, "get", path="/healthz"), True),   # either kind
    ({"serviceAccount": "default/test-serviceaccount", "allowed": True},
     Check(SERVICE_ACCOUNT, "get", resource="pods"), True),
    ({"serviceAccount": "default/other", "allowed": True}, Check(SERVICE_ACCOUNT, "get", resource="pods"), False),
    ({"fieldSelector": "spec.nodeName=n1", "allowed": True},
     Check(USER, "list", resource="pods", field_selector="spec.nodeName=n1"), True),
    ({"fieldSelector": "spec.nodeName=n1", "allowed": True}, Check(USER, "list", resource="pods"), False),
]


@pytest.mark.parametrize(("declared", "check", "covered"), COVERS)
def test_a_declared_answer_covers_the_checks_whose_fields_it_names(declared: dict[str, Any], check: Check,
                                                                     covered: bool) -> None:
    assert parse_answer(declared, "answer").covers(check) is covered


def test_the_first_declared_answer_that_covers_a_check_answers_it() -> None:
    answers = parse_answers([{"verb": "delete", "allowed": False, "reason": "not here"},
                             {"allowed": True, "error": "from the second"}], "authorizer")
    assert answers.answer(DELETE) == Answer(False, "not here")
    assert answers.answer(ESCALATE) == Answer(True, "", "from the second")
    assert DeclaredAnswers().answer(DELETE) is None


@pytest.mark.parametrize(("declared", "message"), [
    ("allow", "answer: an authorizer answer must be an object"),
    ({"verb": "get"}, "answer.allowed is required (true or false)"),
    ({"verb": "get", "allowed": "yes"}, "answer.allowed is required (true or false)"),
    ({"verbs": "get", "allowed": True}, "answer: unknown field 'verbs' in an authorizer answer"),
    ({"groups": ["x"], "allowed": True}, "answer: unknown field 'groups'"),
    ({"verb": 1, "allowed": True}, "answer.verb must be a string"),
    ({"user": "a", "serviceAccount": "ns/sa", "allowed": True}, "answer: give user or serviceAccount, not both"),
    ({"serviceAccount": "sa", "allowed": True}, "answer.serviceAccount must be namespace/name, got 'sa'"),
    ({"serviceAccount": "ns/a/b", "allowed": True}, "answer.serviceAccount must be namespace/name"),
    ({"path": "/x", "resource": "pods", "allowed": True}, "answer: path is for non-resource checks, resource"),
])
def test_a_bad_declared_answer_is_refused_naming_it(declared: Any, message: str) -> None:
    with pytest.raises(DocumentError) as refused:
        parse_answer(declared, "answer")
    assert message in str(refused.value)


def test_declared_answers_must_be_a_list() -> None:
    with pytest.raises(DocumentError, match=r"cases\[0\]\.authorizer must be a list of authorizer answers"):
        parse_answers({"allowed": True}, "cases[0].authorizer")


POLICY_FILE = policy_body("protected-pods", rules=[CREATE_POD_RULE], validations=[
    {"expression": f"{DELETE_PODS}.allowed()", "messageExpression": f"'may not: ' + {DELETE_PODS}.reason()"}])


def cli(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), input=stdin)
    return result.exit_code, result.stdout + result.stderr


def test_a_suite_declares_answers_per_case_or_for_all_and_refuses_an_undeclared_check(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY_FILE))
    (tmp_path / "answers.yaml").write_text(yaml.safe_dump([{"user": "admin", "verb": "delete", "allowed": True}]))
    suite = {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicyTest", "metadata": {"name": "s"},
             "authorizer": ["answers.yaml"],
             "cases": [
                 {"name": "admin", "userInfo": {"username": "admin"}, "object": POD, "expect": {"allowed": True}},
                 {"name": "alice", "userInfo": {"username": "alice"}, "object": POD,
                  "authorizer": [{"user": "alice", "resource": "pods", "namespace": "team-a", "allowed": False,
                                  "reason": "no RoleBinding"}],
                  "expect": {"allowed": False, "messageContains": "may not: no RoleBinding"}},
                 {"name": "bob", "userInfo": {"username": "bob"}, "object": POD, "expect": {"allowed": False}},
             ]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(suite))
    code, out = cli("test", str(tmp_path))
    assert code == 1, out
    assert "PASS  admin" in out and "PASS  alice" in out
    assert ('FAIL  bob\n        cannot run: no answer for the authorizer check(s): {"user": "bob", "verb": "delete", '
            '"group": "", "resource": "pods", "namespace": "team-a"}') in out


def test_the_commands_take_answers_from_files_and_refuse_a_check_none_covers(tmp_path: Path) -> None:
    policy_file, answers, pod = tmp_path / "policy.yaml", tmp_path / "answers.yaml", tmp_path / "pod.yaml"
    policy_file.write_text(yaml.safe_dump(POLICY_FILE))
    answers.write_text(yaml.safe_dump([{"verb": "delete", "resource": "pods", "allowed": False, "reason": "nope"}]))
    pod.write_text(yaml.safe_dump(POD))
    code, out = cli("test", "-p", str(policy_file), "--authorizer", str(answers), str(pod))
    assert code == 0 and "may not: nope" in out, out
    code, out = cli("test", "-p", str(policy_file), str(pod))
    assert code == 2 and '"verb": "delete"' in out and "--authorizer FILE" in out, out
    code, out = cli("audit", "-p", str(policy_file), "--authorizer", str(answers), str(pod))
    assert code == 1 and "may not: nope" in out, out
    code, out = cli("audit", "-p", str(policy_file), str(pod))
    assert code == 2 and "no answer for the authorizer check(s)" in out, out
    review = builders.review(POD, name="web", namespace="team-a", user_info={"username": "alice"})
    code, out = cli("review", "-p", str(policy_file), "--authorizer", str(answers), "-", stdin=yaml.safe_dump(review))
    assert code == 0 and '"allowed": false' in out and "may not: nope" in out, out
    code, out = cli("review", "-p", str(policy_file), "-", stdin=yaml.safe_dump(review))
    assert code == 2 and "no answer for the authorizer check(s)" in out, out
