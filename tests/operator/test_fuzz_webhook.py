"""Issue 12, scenario 5 (a): hostile and malformed AdmissionReviews posted to the real webhook
server over TLS (the ``serving`` fixture: the operator with the example policies), fuzzed with
hypothesis (profiles in tests/conftest.py; HYPOTHESIS_PROFILE=long for more examples).

Whatever arrives — wrong types, missing fields, unknown API versions, bodies cut short or not
UTF-8, nesting thousands deep, objects of about 3 MiB, many at once — the server answers a
well-formed AdmissionReview that echoes the uid, or a 4xx that says what is wrong: never a 5xx,
never a traceback in its log, never a hang; and a normal review is answered right after.

Hypothesis runs its examples synchronously, so each property runs in a worker thread with a
blocking HTTPS client while the operator serves on the test's event loop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import http.client
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from operator_env import Webhook, pod_request, policy_request

from builders import policy_body
from jsonpaths import get, paths

# The operator serves from the test's event loop in another thread while hypothesis draws examples,
# and its libraries use the `random` module meanwhile: hypothesis takes that for the strategies'.
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
ANSWER_TIMEOUT = 30.0        # a hang is a failure, not a stuck test run


class Client:
    """A blocking HTTPS client for the worker thread: a connection per post, as a fuzzer's
    garbage may leave a connection unusable."""

    def __init__(self, webhook: Webhook) -> None:
        self.context, self.port = webhook.context, webhook.port

    def post(self, path: str, body: bytes, content_type: str | None = "application/json") -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection("localhost", self.port, context=self.context, timeout=ANSWER_TIMEOUT)
        try:
            headers = {"Content-Type": content_type} if content_type is not None else {}
            connection.request("POST", path, body, headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


def strict_json(data: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")
    return json.loads(data, parse_constant=refuse)


def sent_uid(body: bytes) -> Any:
    """The uid of what was posted, if it was JSON with one (the server must echo exactly that)."""
    with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
        return json.loads(body)["request"]["uid"]
    return None


def assert_well_answered(status: int, answer: bytes, body: bytes) -> None:
    """The property: a well-formed review echoing the uid, or a 4xx with a message."""
    assert status < 500, f"HTTP {status}: {answer[:500]!r}"
    if status == 200:
        review = strict_json(answer)
        assert review["kind"] == "AdmissionReview" and review["apiVersion"] in REVIEW_VERSIONS, review
        response = review["response"]
        assert response["uid"] == sent_uid(body), response
        assert isinstance(response["allowed"], bool), response
        if not response["allowed"]:   # a code of 500 or "internal error" is an exception of ours, caught
            status_ = response["status"]
            assert 400 <= status_["code"] < 500 and status_["message"], response
            assert "internal error" not in status_["message"] and "engine failed" not in status_["message"], response
    else:
        assert 400 <= status < 500, f"HTTP {status}: {answer[:500]!r}"
        assert answer.decode("utf-8").strip(), f"HTTP {status} without a word of why"


class Served:
    """The client, and what a property checks around every hostile post."""

    def __init__(self, webhook: Webhook, caplog: pytest.LogCaptureFixture) -> None:
        self.client = Client(webhook)
        self.caplog = caplog

    def post(self, path: str, body: bytes, content_type: str | None = "application/json") -> tuple[int, bytes]:
        """Post; then the answer is checked, the log holds no new error or traceback, and a normal
        review is still answered as the policies say (so a crash is pinned on its cause)."""
        logged = len(self.caplog.records)
        status, answer = self.client.post(path, body, content_type)
        assert_well_answered(status, answer, body)
        assert_still_serving(self.client)
        troubles = [r for r in self.caplog.records[logged:] if r.levelno >= logging.ERROR or r.exc_info]
        assert not troubles, [f"{r.levelname} {r.name}: {r.getMessage()}" for r in troubles]
        return status, answer


def assert_still_serving(client: Client) -> None:
    normal = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": pod_request("offensive-pod", labels={"team": "a"}, uid="still-serving")})
    status, answer = client.post("/validate", normal.encode())
    assert status == 200, answer
    response = strict_json(answer)["response"]
    assert response["uid"] == "still-serving" and response["allowed"] is False, response


@contextlib.asynccontextmanager
async def served(serving: Callable[[], contextlib.AbstractAsyncContextManager[Webhook]],
                 caplog: pytest.LogCaptureFixture) -> Any:
    async with serving() as webhook:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            yield Served(webhook, caplog)
        # And after the whole run, from the event loop's side too.
        assert (await webhook.review("/validate", pod_request("web", labels={"team": "a"})))["allowed"] is True


def review_of(request: Any, api_version: Any = "admission.k8s.io/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def encode(value: Any) -> bytes:
    """JSON as a client would send it; lone surrogates as JSON's \\ud800 escapes (ASCII output)."""
    return json.dumps(value, allow_nan=True).encode("ascii")


# --- structure: a valid review with fields replaced, removed or added ----------------------------------------

POD_REVIEW = review_of(pod_request("offensive-pod", labels={"team": "a", "acme.com/lifespan-requested": "3"}))
POLICY_REVIEW = review_of(policy_request(policy_body(
    "fuzzed", variables=[{"name": "n", "expression": "object.metadata.name"}],
    validations=[{"expression": "!variables.n.contains('x')", "messageExpression": "'bad ' + variables.n"}],
    mutations=[{"name": "m", "jsonPatch": [{"op": "add", "path": "/metadata/labels/a", "value": "b"}]}])))
BASES = {"/validate": POD_REVIEW, "/mutate": POD_REVIEW, "/validate-policy": POLICY_REVIEW}

# JSON has string keys only; the rest is fair game, with what the API server would never send.
STRINGS = st.one_of(st.text(max_size=16), st.sampled_from([
    "", "\ud800", "a\udfffb", "\x00", "é", "CREATE", "UPDATE", "DELETE", "CONNECT", "pods", "v1", "",
    "admission.k8s.io/v2", "admission.k8s.io/v1beta2", "v1", "AdmissionReview", "object.metadata.name.startsWith(",
    "'\ud800' == ''", "offensive"]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63), st.floats(allow_nan=False),
                    STRINGS)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(STRINGS, inner, max_size=4)), max_leaves=10)


@st.composite
def edited_review(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(BASES)))
    body: Any = copy.deepcopy(BASES[path])
    places = list(paths(body))
    for _ in range(draw(st.integers(1, 3))):
        place = draw(st.sampled_from(places))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        try:
            target = get(body, place[:-1])
            if action == "replace" and place:
                target[place[-1]] = draw(VALUES)
            elif action == "delete" and place:
                del target[place[-1]]
            elif action == "add":
                holder = target[place[-1]] if place else target
                if isinstance(holder, dict):
                    holder[draw(STRINGS)] = draw(VALUES)
            elif not place:
                body = draw(VALUES)
        except (KeyError, IndexError, TypeError):   # an earlier edit changed the place
            continue
    return path, encode(body)


def _edited_reviews(served: Served) -> None:
    @settings(suppress_health_check=[HealthCheck.too_slow])
    @given(edited_review())
    @example(("/validate", encode({**POD_REVIEW, "apiVersion": "admission.k8s.io/v2"})))
    @example(("/validate", encode(review_of({**POD_REVIEW["request"], "uid": 7}))))
    @example(("/validate", encode(review_of({**POD_REVIEW["request"], "object": {
        **POD_REVIEW["request"]["object"], "metadata": {"name": "\ud800", "labels": {"\udfff": 1}}}}))))
    @example(("/validate-policy", encode(review_of(policy_request(policy_body(
        "fuzzed", validations=[{"expression": "'\ud800' == ''"}]))))))
    @example(("/validate-policy", encode(review_of(policy_request(policy_body(
        "fuzzed", match={"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                        "operations": ["CREATE"]}], "namespaceSelector": {"matchLabels": {"": 1}}},
        validations=[{"expression": "true"}]))))))
    def check(case: tuple[str, bytes]) -> None:
        served.post(*case)
    check()


async def test_a_review_with_any_field_wrong_is_answered_or_refused_with_a_4xx(
        serving: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with served(serving, caplog) as fuzz:
        await asyncio.to_thread(_edited_reviews, fuzz)


# --- bytes: cut short, not UTF-8, not JSON, any content type ---------------------------------------------------

VALID_BYTES = encode(POD_REVIEW)
CONTENT_TYPES = st.sampled_from([None, "application/json", "application/json; charset=utf-8", "text/plain",
                                 "application/json; charset=latin-1", "application/json; charset=", "",
                                 "application/json; charset=\"UTF-8\"", "multipart/form-data; boundary=x"])


@st.composite
def raw_body(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["truncated", "corrupted", "binary", "reencoded"]))
    if kind == "truncated":
        return VALID_BYTES[:draw(st.integers(0, len(VALID_BYTES) - 1))]
    if kind == "corrupted":   # bytes that are not UTF-8 (or NULs, or quotes) somewhere in valid JSON
        at = draw(st.integers(0, len(VALID_BYTES)))
        return VALID_BYTES[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b'"', b"\\"])) \
            + VALID_BYTES[at:]
    if kind == "binary":
        return draw(st.binary(max_size=512))
    return VALID_BYTES.decode().encode(draw(st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "latin-1"])))


def _raw_bodies(served: Served) -> None:
    @settings(suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(sorted(BASES)), raw_body(), CONTENT_TYPES)
    @example("/validate", VALID_BYTES[:-1], "application/json")
    @example("/validate", VALID_BYTES.replace(b'"offensive-pod"', b'"\\ud800"', 1), "application/json")
    def check(path: str, body: bytes, content_type: str | None) -> None:
        served.post(path, body, content_type)
    check()


async def test_a_body_cut_short_or_not_utf8_json_is_answered_with_a_4xx(
        serving: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with served(serving, caplog) as fuzz:
        await asyncio.to_thread(_raw_bodies, fuzz)


# --- size: nesting thousands deep, objects of about 3 MiB -----------------------------------------------------

def nested(depth: int, mapping: bool) -> str:
    return ('{"a":' * depth + "1" + "}" * depth) if mapping else ("[" * depth + "1" + "]" * depth)


@st.composite
def large_review(draw: st.DrawFn) -> tuple[str, bytes]:
    """A pod review grown in one of the ways an object can be large: deep, long, wide or many."""
    request = copy.deepcopy(POD_REVIEW["request"])
    pod = request["object"]
    shape = draw(st.sampled_from(["deep", "string", "labels", "containers", "update"]))
    size = draw(st.integers(min_value=2_500_000, max_value=4_400_000))   # about 3 MiB; past 4 MiB is a 413
    if shape == "deep":
        pod["spec"]["deep"] = "@"
        text = json.dumps(review_of(request)).replace('"@"', nested(draw(st.integers(1, 4_000)), draw(st.booleans())))
        return draw(st.sampled_from(["/validate", "/mutate"])), text.encode()
    if shape == "string":
        pod["metadata"]["annotations"] = {"blob": draw(st.sampled_from("x,é\ud800")) * (size // 2)}
    elif shape == "labels":
        pod["metadata"]["labels"] = {f"k{i:07d}": "v" * 20 for i in range(size // 34)}
    elif shape == "containers":
        pod["spec"]["containers"] = [{"name": f"c{i}", "image": "registry.example/app:1"} for i in range(size // 50)]
    else:   # an UPDATE carries two objects
        pod["metadata"]["annotations"] = {"blob": "y" * (size // 2)}
        request.update(operation="UPDATE", oldObject=copy.deepcopy(pod))
    return draw(st.sampled_from(["/validate", "/mutate"])), encode(review_of(request))


def _large_reviews(served: Served) -> None:
    @settings(max_examples=max(8, settings().max_examples // 4),   # megabytes each: fewer
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(large_review())
    def check(case: tuple[str, bytes]) -> None:
        served.post(*case)
    check()


async def test_a_deep_or_3_mib_review_is_answered_or_refused_with_a_4xx(
        serving: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with served(serving, caplog) as fuzz:
        await asyncio.to_thread(_large_reviews, fuzz)


# --- many at once: hostile bodies alongside normal reviews ------------------------------------------------------

def _bursts(served: Served) -> None:
    @settings(max_examples=max(5, settings().max_examples // 6),
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(st.lists(st.one_of(edited_review(), st.tuples(st.just("/validate"), raw_body()), large_review()),
                    min_size=2, max_size=8))
    def check(cases: list[tuple[str, bytes]]) -> None:
        # Each hostile post runs beside a normal review: neither may wait for the other forever.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2 * len(cases)) as pool:
            hostile = [pool.submit(served.client.post, path, body) for path, body in cases]
            normal = [pool.submit(assert_still_serving, served.client) for _ in cases]
            for (_, body), answered in zip(cases, hostile, strict=True):
                assert_well_answered(*answered.result(), body)
            for checked in normal:
                checked.result()
    check()


async def test_many_hostile_reviews_at_once_leave_normal_ones_answered(
        serving: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with served(serving, caplog) as fuzz:
        await asyncio.to_thread(_bursts, fuzz)
        troubles = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert not troubles, [f"{r.levelname} {r.name}: {r.getMessage()}" for r in troubles]


def test_the_answers_property_can_fail() -> None:
    """The checks the properties rest on refuse what a broken server would send."""
    body = encode(POD_REVIEW)
    good = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": {"uid": POD_REVIEW["request"]["uid"], "allowed": True}}).encode()
    assert_well_answered(200, good, body)
    assert_well_answered(400, b"invalid AdmissionReview: request.uid is required", body)
    for status, answer in ((500, b"Internal Server Error"), (400, b""), (200, good.replace(b"-0000-", b"-1111-", 1)),
                           (200, good.replace(b"true", b"NaN")), (200, b"{}")):
        with pytest.raises((AssertionError, KeyError, ValueError)):
            assert_well_answered(status, answer, body)
