"""The operator's real webhook server over TLS, verified against the CA it generated, fed real
AdmissionReview JSON: what the API server would send and get back."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import gc
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import jsonpatch
import pytest
from emulator import wait_for
from operator_env import Webhook, pod_request, policy_request

from builders import policy_body


async def test_allows_a_compliant_pod(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}))
        assert response == {"uid": "b0c1a2d3-0000-4000-8000-000000000001", "allowed": True}


async def test_denies_with_status_code_and_message(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("offensive-pod", labels={"team": "a"}))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert response["status"]["reason"] == "Forbidden"
        assert 'AdmissionPolicy "deny-offensive-pod-names" denied the request' in response["status"]["message"]


async def test_warns(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("web"))
        assert response["allowed"] is True
        assert response["warnings"] == ['AdmissionPolicy "team-warn": pods need a team']


async def test_audits(serving: Any) -> None:
    async with serving() as webhook:
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}, image="nginx"))
        assert response["allowed"] is True and "warnings" not in response
        assert json.loads(response["auditAnnotations"]["audit-images"]) == ["images should be pinned"]


async def test_mutates_with_a_json_patch_that_yields_the_expected_object(serving: Any) -> None:
    async with serving() as webhook:
        request = pod_request("web", labels={"acme.com/lifespan-requested": "3"})
        response = await webhook.review("/mutate", request)
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        expected = copy.deepcopy(request["object"])
        expected["spec"]["tolerations"] = [{"key": "acme.com/lifespan-remaining", "operator": "Equal", "value": "14",
                                            "effect": "NoSchedule"}]
        assert jsonpatch.apply_patch(request["object"], patch) == expected


async def test_the_validating_path_does_not_mutate_and_the_mutating_path_does_not_validate(serving: Any) -> None:
    async with serving() as webhook:
        request = pod_request("offensive-pod", labels={"acme.com/lifespan-requested": "3"})
        mutated = await webhook.review("/mutate", request)
        assert mutated["allowed"] is True and "patch" in mutated
        validated = await webhook.review("/validate", request)
        assert validated["allowed"] is False and "patch" not in validated


@pytest.mark.parametrize(("body", "words"), [
    ("{not json", "Expecting property name"),
    ("[1, 2]", "an AdmissionReview must be a JSON object"),
    (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "x"}}),
     "request.operation is required"),
])
async def test_a_malformed_body_gets_a_400_and_the_server_keeps_serving(serving: Any, body: str,
                                                                       words: str) -> None:
    async with serving() as webhook:
        status, answer = await webhook.post("/validate", body)
        assert status == 400
        assert words in str(answer)
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}))
        assert response["allowed"] is True


async def test_an_invalid_policy_is_rejected_naming_the_field_and_the_compiler_message(serving: Any) -> None:
    async with serving() as webhook:
        policy = policy_body("broken", validations=[{"expression": "object.metadata.name.startsWith("}])
        request = policy_request(policy, uid="c0ffee00-0000-4000-8000-000000000002")
        response = await webhook.review("/validate-policy", request)
        assert response["allowed"] is False
        assert response["status"]["code"] == 422
        message = response["status"]["message"]
        assert "AdmissionPolicy 'broken' is invalid" in message
        assert "spec.validations[0].expression (line 1, column" in message and "Syntax error" in message
        request["object"] = policy_body("fine", validations=[{"expression": "true"}])
        request["uid"] = "c0ffee00-0000-4000-8000-000000000003"
        assert (await webhook.review("/validate-policy", request))["allowed"] is True


async def test_a_misspelt_field_is_a_warning_unless_the_policy_asks_for_a_refusal(serving: Any) -> None:
    """Type checking at `kubectl apply`: a warning naming the policy, field, kind, line and column;
    with ``typeChecking: Deny`` the same finding refuses the policy."""
    async with serving() as webhook:
        typo = [{"expression": "object.spec.contianers.all(c, has(c.securityContext))"}]
        request = policy_request(policy_body("typo", validations=typo), uid="c0ffee00-0000-4000-8000-000000000007")
        response = await webhook.review("/validate-policy", request)
        assert response["allowed"] is True
        assert response["warnings"] == [
            "AdmissionPolicy 'typo': spec.validations[0].expression: v1, Kind=Pod: undefined field 'contianers' "
            "not found in struct 'PodSpec' (line 1, column 12)"]
        request = policy_request(policy_body("typo", validations=typo, typeChecking="Deny"),
                                 uid="c0ffee00-0000-4000-8000-000000000008")
        response = await webhook.review("/validate-policy", request)
        assert response["allowed"] is False and response["status"]["code"] == 422
        assert "AdmissionPolicy 'typo' is invalid: spec.validations[0].expression: v1, Kind=Pod: undefined field " \
               "'contianers'" in response["status"]["message"]


async def test_a_policy_update_that_leaves_the_spec_alone_is_never_refused(serving: Any) -> None:
    """Removing a finalizer or labelling a policy that slipped in broken must stay possible, also on
    API servers without ``matchConditions`` (they send every UPDATE); a spec edit is still judged."""
    async with serving() as webhook:
        broken = policy_body("slipped-in", validations=[{"expression": "object.metadata.name.startsWith("}])
        relabelled = copy.deepcopy(broken)
        relabelled["metadata"].update(labels={"team": "a"}, finalizers=[])
        request = policy_request(relabelled, operation="UPDATE", old=broken, uid="c0ffee00-0000-4000-8000-000000000004")
        assert (await webhook.review("/validate-policy", request))["allowed"] is True

        deleting = copy.deepcopy(broken)
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        deleting["spec"]["description"] = "changed while being deleted"
        request.update(uid="c0ffee00-0000-4000-8000-000000000005", object=deleting)
        assert (await webhook.review("/validate-policy", request))["allowed"] is True

        edited = copy.deepcopy(broken)
        edited["spec"]["description"] = "a spec edit is judged"
        request.update(uid="c0ffee00-0000-4000-8000-000000000006", object=edited)
        response = await webhook.review("/validate-policy", request)
        assert response["allowed"] is False and response["status"]["code"] == 422


async def test_no_per_request_log_lines_at_info(serving: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with serving() as webhook:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            for name in ("web", "offensive-pod"):
                await webhook.review("/validate", pod_request(name, labels={"team": "a"}))
        noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "Webhook" in r.getMessage()]
        assert noisy == []


async def test_updates_of_many_objects_leave_nothing_behind(serving: Any) -> None:
    # Kopf keeps a memory per object uid for every UPDATE it admits and forgets it only when a
    # watch it runs sees the object deleted: for pods that would grow without bound.
    from kopf._core.reactor.inventory import ResourceMemory

    def memories() -> int:
        return sum(isinstance(o, ResourceMemory) for o in gc.get_objects())

    async with serving() as webhook:
        before = memories()
        for index in range(60):
            request = pod_request(f"web-{index}", labels={"team": "a"})
            request.update(operation="UPDATE", oldObject=copy.deepcopy(request["object"]),
                           options={"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"})
            for body in (request["object"], request["oldObject"]):
                body["metadata"]["uid"] = f"7e570000-0000-4000-8000-{index:012d}"
            assert (await webhook.review("/validate", request))["allowed"] is True
        assert memories() - before <= 1


DENIED = 'admission_policy_requests_total{decision="denied",operation="CREATE",policy="deny-offensive-pod-names"}'


def metric(text: str, name: str) -> float:
    """A sample's value (0 when absent): the registry is per process, so tests compare deltas."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_probes_and_metrics(serving: Any) -> None:
    import os
    async with serving() as webhook, aiohttp.ClientSession() as session:
        metrics_url = f"http://127.0.0.1:{os.environ['AP_METRICS_PORT']}/metrics"
        health = f"http://127.0.0.1:{os.environ['AP_HEALTH_PORT']}"
        async with session.get(metrics_url) as response:
            before = await response.text()
        await webhook.review("/validate", pod_request("offensive-pod", labels={"team": "a"}))
        async with session.get(f"{health}/healthz") as response:
            assert response.status == 200
        async with session.get(f"{health}/readyz") as response:
            assert response.status == 200
        async with session.get(metrics_url) as response:
            after = await response.text()
    assert metric(after, DENIED) == metric(before, DENIED) + 1
    count, infinity = ('admission_policy_evaluation_seconds_count{webhook="validate"}',
                       'admission_policy_evaluation_seconds_bucket{le="+Inf",webhook="validate"}')
    assert metric(after, count) == metric(before, count) + 1 == metric(after, infinity)
    assert metric(after, "admission_policy_policies_loaded") >= 4


# --- hardening: what reaches the server that the API server would never send (issue 18) -----------------------

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


def review_text(request: dict[str, Any]) -> str:
    return json.dumps({**REVIEW, "request": request})


@pytest.mark.parametrize("path", ["/unknown", "/", "/validate/extra", "/validatex", "/kopf/validate"])
async def test_a_path_that_is_not_ours_gets_404_not_an_allow(serving: Any, path: str) -> None:
    """Kopf answers ``allowed: true`` for a path naming no handler: a mistyped URL would disable
    enforcement without a word."""
    async with serving() as webhook:
        status, answer = await webhook.post(path, review_text(pod_request("offensive-pod", labels={"team": "a"})))
        assert status == 404, answer


async def test_a_review_of_two_objects_at_the_api_servers_size_limit_is_served(serving: Any) -> None:
    async with serving() as webhook:
        request = pod_request("web", labels={"team": "a"})
        request["object"]["metadata"]["annotations"] = {"big": "x" * (1536 * 1024 - 2048)}
        request.update(operation="UPDATE", oldObject=copy.deepcopy(request["object"]))
        response = await webhook.review("/validate", request)
        assert response["allowed"] is True


async def test_a_review_over_the_size_limit_gets_413_saying_so(serving: Any) -> None:
    async with serving() as webhook:
        request = pod_request("web", labels={"team": "a"})
        request["object"]["metadata"]["annotations"] = {"big": "x" * (5 * 1024 * 1024)}
        status, answer = await webhook.post("/validate", review_text(request))
        assert status == 413
        assert "AdmissionReview" in str(answer) and "limit" in str(answer)


def without(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def malformed(change: Callable[[dict[str, Any]], Any]) -> str:
    request = pod_request("offensive-pod", labels={"team": "a"})
    change(request)
    return review_text(request)


DEEP = 20_000


@pytest.mark.parametrize(("body", "words"), [
    (malformed(lambda r: r.update(resource=without(r["resource"], "version"))), "request.resource.version is required"),
    (malformed(lambda r: r["object"].update(metadata="offensive-pod")), "request.object.metadata must be an object"),
    (malformed(lambda r: r["object"].update(metadata=5)), "request.object.metadata must be an object"),
    (malformed(lambda r: r["object"].update(metadata=[0])), "request.object.metadata must be an object"),
    (malformed(lambda r: r.update(operation="UPDATE", oldObject={**r["object"], "metadata": "x"})),
     "request.oldObject.metadata must be an object"),
    (malformed(lambda r: r["object"]["spec"].update(priority=float("nan"))), "NaN"),
    (malformed(lambda r: r["object"]["spec"].update(priority=float("inf"))), "Infinity"),
    (malformed(lambda r: r["object"]["spec"].update(priority=float("-inf"))), "-Infinity"),
    (malformed(lambda r: r["object"]["spec"].update(priority="@")).replace('"@"', "1e400"), "1e400"),
    (malformed(lambda r: r["object"]["spec"].update(deep="@")).replace('"@"', "[" * DEEP + "]" * DEEP),
     "nested deeper than"),
])
async def test_a_malformed_review_gets_a_400_naming_what_is_wrong(serving: Any, body: str, words: str) -> None:
    async with serving() as webhook:
        status, answer = await webhook.post("/validate", body)
        assert status == 400, answer
        assert words in str(answer)


@pytest.mark.parametrize(("body", "content_type", "words"), [
    (review_text(pod_request("web")).encode().replace(b'"web"', b'"w\xffb"'), "application/json", "UTF-8"),
    (review_text(pod_request("web")).encode("utf-16"), "application/json", "UTF-8"),
    (review_text(pod_request("web")).encode("utf-16"), "application/json; charset=utf-16", "charset"),
    (review_text(pod_request("web")).encode(), "application/json; charset=bogus", "charset"),
])
async def test_a_body_that_is_not_utf8_json_gets_a_400(serving: Any, body: bytes, content_type: str,
                                                       words: str) -> None:
    async with serving() as webhook:
        status, answer = await webhook.post("/validate", body, content_type=content_type)
        assert status == 400, answer
        assert words in str(answer)


async def test_utf8_named_as_such_is_fine(serving: Any) -> None:
    async with serving() as webhook:
        body = review_text(pod_request("web", labels={"team": "caf\u00e9"})).encode()
        status, answer = await webhook.post("/validate", body, content_type="application/json; charset=UTF-8")
        assert status == 200 and answer["response"]["allowed"] is True


async def test_a_resource_without_group_is_the_core_group(serving: Any) -> None:
    """Go decodes an absent ``group`` as "", the core group, so the review is answered as such."""
    async with serving() as webhook:
        request = pod_request("offensive-pod", labels={"team": "a"})
        request["resource"] = without(request["resource"], "group")
        response = await webhook.review("/validate", request)
        assert response["allowed"] is False and response["status"]["code"] == 403


async def test_an_object_as_deep_as_the_webhook_takes_gets_a_review_answer(serving: Any) -> None:
    """Nesting up to ``MAX_JSON_DEPTH`` is decoded and evaluated, never a crash; deeper is a 400
    (see ``request.MAX_JSON_DEPTH`` for why not the API server's 10,000)."""
    from admission_policy.engine.request import MAX_JSON_DEPTH
    async with serving() as webhook:
        request = pod_request("offensive-pod", labels={"team": "a"})
        request["object"]["spec"]["deep"] = "@"
        depth = MAX_JSON_DEPTH - 4      # the review, request, object and spec around it
        status, answer = await webhook.post("/validate", review_text(request).replace('"@"', "[" * depth + "]" * depth))
        assert status == 200, answer
        assert answer["response"]["uid"] == request["uid"] and answer["response"]["allowed"] is False
        depth += 50
        status, answer = await webhook.post("/validate", review_text(request).replace('"@"', "[" * depth + "]" * depth))
        assert status == 400 and f"nested deeper than {MAX_JSON_DEPTH} levels" in answer


# --- connections: idle ones, slow ones, too many, and clients that go away ------------------------------------

@contextlib.asynccontextmanager
async def connection(webhook: Webhook) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw TLS connection to the webhook, for what an HTTP client library would not do."""
    reader, writer = await asyncio.open_connection("localhost", webhook.port, ssl=webhook.context)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def closed_by_server(reader: asyncio.StreamReader, deadline: float = 30.0) -> bytes:
    """What the server sent before closing the connection (fails if it is still open at the deadline)."""
    received = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        async with asyncio.timeout(deadline):
            while chunk := await reader.read(65536):
                received += chunk
    return received


def request_head(path: str, length: int, expect: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + (f"Expect: {expect}\r\n" if expect else "") + f"Content-Length: {length}\r\n\r\n").encode()


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(serving: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from admission_policy.operator import webhook as server
    monkeypatch.setattr(server.PolicyWebhookServer, "keepalive_timeout", 0.5, raising=False)
    async with serving() as webhook, connection(webhook) as (reader, _):
        assert await closed_by_server(reader) == b""


async def test_a_request_whose_body_never_arrives_is_given_up(serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AP_WEBHOOK_TIMEOUT", "1")
    async with serving() as webhook, connection(webhook) as (reader, writer):
        writer.write(request_head("/validate", 1000) + b'{"kind": ')
        await writer.drain()
        assert (await closed_by_server(reader)).startswith(b"HTTP/1.1 408")


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: its status and body."""
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


COMPLIANT = review_text(pod_request("web", labels={"team": "a"})).encode()


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(request_head("/validate", len(COMPLIANT)) + COMPLIANT)
    await writer.drain()
    return (await read_response(reader))[0]


async def test_at_the_connection_cap_the_longest_idle_connection_makes_room(
        serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another client holding connections open cannot lock the API server out; but a connection
    that answered a moment ago is not closed for a newcomer: its client is about to reuse it, and
    the API server does not retry a request written onto a connection as it closes (issue 12)."""
    from admission_policy.operator import webhook as server
    monkeypatch.setattr(server.PolicyWebhookServer, "min_idle_to_evict", 1.0)
    monkeypatch.setenv("AP_MAX_CONNECTIONS", "2")
    async with serving() as webhook, connection(webhook) as first, connection(webhook) as second:
        assert await exchange(*first) == 200
        assert await exchange(*second) == 200      # both open and idle; the first idle the longest
        async with connection(webhook) as (early, _):
            assert await closed_by_server(early) == b""   # refused: both answered less than 1 s ago
        await asyncio.sleep(1.2)
        assert await exchange(*second) == 200      # the second active again; the first idle for 1 s
        async with connection(webhook) as third:
            assert await exchange(*third) == 200
            assert await closed_by_server(first[0]) == b""
            assert await exchange(*second) == 200


async def test_at_the_connection_cap_a_client_trickling_bytes_still_makes_room(
        serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes that never make a request are not activity: trickled headers keep no place."""
    from admission_policy.operator import webhook as server
    monkeypatch.setattr(server.PolicyWebhookServer, "min_idle_to_evict", 0.5)
    monkeypatch.setenv("AP_MAX_CONNECTIONS", "1")
    async with serving() as webhook, connection(webhook) as (trickled, writer):
        for byte in b"POST /validate HTTP/1.1\r\n":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)
        async with connection(webhook) as newcomer:
            assert await exchange(*newcomer) == 200
            assert await closed_by_server(trickled) == b""


async def test_with_the_cap_held_by_connections_that_send_nothing_a_review_is_still_answered(
        serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections opened to fill the cap and left silent cannot lock the API server out, however
    recently they were opened: one of them is closed for the newcomer (issue 25)."""
    from admission_policy.operator import webhook as server
    monkeypatch.setattr(server.PolicyWebhookServer, "min_idle_to_evict", 600.0)   # all of them "recent"
    monkeypatch.setenv("AP_MAX_CONNECTIONS", "2")
    async with serving() as webhook, connection(webhook) as (first, _), connection(webhook):
        response = await webhook.review("/validate", pod_request("web", labels={"team": "a"}))
        assert response["allowed"] is True
        assert await closed_by_server(first) == b""   # the oldest silent one made room


async def test_at_the_connection_cap_a_silent_connection_makes_room_before_the_api_servers_idle_one(
        serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server's connection idle between its requests is kept while a connection that never
    sent a request is open, even one opened after it: that one is closed for the newcomer."""
    from admission_policy.operator import webhook as server
    monkeypatch.setattr(server.PolicyWebhookServer, "min_idle_to_evict", 0.5)
    monkeypatch.setenv("AP_MAX_CONNECTIONS", "2")
    async with serving() as webhook, connection(webhook) as api_server:
        assert await exchange(*api_server) == 200
        async with connection(webhook) as (silent, _):
            await asyncio.sleep(1.0)   # both idle past min_idle_to_evict, the API server's the longest
            async with connection(webhook) as newcomer:
                assert await exchange(*newcomer) == 200
                assert await closed_by_server(silent) == b""
                assert await exchange(*api_server) == 200


async def test_when_every_connection_is_answering_a_request_a_new_one_is_refused(
        serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AP_MAX_CONNECTIONS", "2")
    monkeypatch.setenv("AP_WEBHOOK_TIMEOUT", "30")
    async with serving() as webhook, connection(webhook) as first, connection(webhook) as second:
        for reader, writer in (first, second):
            # "100 Continue" says the server is answering this request and waits for its body.
            writer.write(request_head("/validate", len(COMPLIANT), expect="100-continue"))
            await writer.drain()
            assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
            assert await reader.readline() == b"\r\n"
        async with connection(webhook) as (refused, _):
            assert await closed_by_server(refused) == b""
        for reader, writer in (first, second):
            writer.write(COMPLIANT)
            await writer.drain()
            assert (await read_response(reader))[0] == 200


async def test_a_client_that_disconnects_mid_request_costs_one_log_line(serving: Any,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    async with serving() as webhook:
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            async with connection(webhook) as (_, writer):
                writer.write(request_head("/validate", 1000) + b'{"kind": ')
                await writer.drain()
            await wait_for(lambda: any("disconnected" in r.getMessage() for r in caplog.records), timeout=30)
            await webhook.review("/validate", pod_request("web", labels={"team": "a"}))
        told = [r for r in caplog.records if "disconnected" in r.getMessage()]
        assert len(told) == 1 and told[0].levelno == logging.INFO and told[0].exc_info is None
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []


# --- TLS -----------------------------------------------------------------------------------------------------

def client_context(webhook: Webhook, **options: Any) -> ssl.SSLContext:
    """A client that trusts the operator's CA, with the TLS versions or ciphers given."""
    cas = "".join(ssl.DER_cert_to_PEM_cert(ca) for ca in webhook.context.get_ca_certs(binary_form=True))
    context = ssl.create_default_context(cadata=cas)
    for name, value in options.items():
        if name == "ciphers":
            context.set_ciphers(value)
        else:
            setattr(context, name, value)
    return context


@pytest.mark.parametrize("options", [
    {"minimum_version": ssl.TLSVersion.TLSv1, "maximum_version": ssl.TLSVersion.TLSv1_1, "ciphers": "ALL:@SECLEVEL=0"},
    {"maximum_version": ssl.TLSVersion.TLSv1_2, "ciphers": "ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384"},
    {"maximum_version": ssl.TLSVersion.TLSv1_2, "ciphers": "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA"},
])
@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")  # the client's own, on purpose
async def test_tls_below_1_2_or_without_an_aead_cipher_is_refused(serving: Any, options: dict[str, Any]) -> None:
    async with serving() as webhook:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            async with connection(Webhook(client_context(webhook, **options), webhook.base)):
                pass


async def test_tls_1_2_with_the_go_clients_ciphers_is_served(serving: Any) -> None:
    async with serving() as webhook:
        context = client_context(webhook, maximum_version=ssl.TLSVersion.TLSv1_2,
                                 ciphers="ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305")
        assert (await Webhook(context, webhook.base).review("/validate", pod_request("web")))["allowed"] is True


# --- stopping: the API server's keep-alive connections are handed back, not cut (issue 33) ------------------

async def answer_and_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[int, str]:
    """One review on this connection: the status and the Connection header of the answer."""
    writer.write(request_head("/validate", len(COMPLIANT)) + COMPLIANT)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length, kept = 0, ""
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "connection":
            kept = value.strip().lower()
    await reader.readexactly(length)
    return status, kept


async def test_a_stopping_replica_answers_on_its_open_connections_and_asks_the_client_to_close_them(
        emulator: Any, run_operator: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A rollout stops replicas while the API server keeps connections open to them, and it does
    not retry a review written onto a connection the server closes: one refused admission per
    connection cut (issue 33). Stopping, the server answers each review on an open connection
    with ``Connection: close`` (so the client opens its next one elsewhere), and closes only the
    connections left idle."""
    from emulator import VALIDATING_WEBHOOK_CONFIGURATIONS
    from operator_env import CONFIG_NAME, operator_environment, operator_running, webhook_client

    from admission_policy.operator import webhook as server
    monkeypatch.setattr(server.PolicyWebhookServer, "drain_quiet", 2.0)
    env = operator_environment(monkeypatch, tmp_path / "certs")
    async with operator_running(run_operator) as op:
        await wait_for(lambda: emulator.peek(VALIDATING_WEBHOOK_CONFIGURATIONS, CONFIG_NAME) is not None, timeout=20)
        webhook = webhook_client(emulator, env)
        async with connection(webhook) as busy, connection(webhook) as idle:
            assert await answer_and_connection(*busy) == (200, "")   # HTTP/1.1: kept alive
            assert (await answer_and_connection(*idle))[0] == 200
            op.stop_flag.set()
            answers = []
            while not answers or answers[-1] != (200, "close"):   # served on, until the server drains
                answers.append(await answer_and_connection(*busy))
                assert answers[-1][0] == 200, answers
            assert await closed_by_server(busy[0]) == b""   # closed after that answer, as it said
            # The connection idle meanwhile was kept open, and is served the same way.
            assert await answer_and_connection(*idle) == (200, "close")
            assert await closed_by_server(idle[0]) == b""
