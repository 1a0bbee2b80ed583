"""Every case of every ``examples/*/test.yaml``, replayed as a real request through the API server.

One test per case, so a failure names the example and the case; replay.py says how a case becomes a
request, what is checked, and which cases a real API server cannot replay as written (``DEVIATIONS``).
CONNECTs (`kubectl exec`, `kubectl attach`), which no example has, are tested here too.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pykube
import pytest
from e2e_kube import Answer, Cluster, OperatorProcess, Policies, eventually, policy_body
from replay import CASES, Case, Stages, check, send

from builders import container, pod

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stages(cluster: Cluster, operator: OperatorProcess) -> Iterator[Stages]:
    stages = Stages(cluster)
    yield stages
    stages.close()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_example_case(case: Case, stages: Stages) -> None:
    """The case's expected outcome, from the real API server calling the operator with the example's policies.

    A case listed in ``DEVIATIONS`` is replaced by the replays given there (what the API server really
    does with it, and a faithful variant that it accepts); each is checked the same way.
    """
    stage = stages.enter(case.example)
    failures = []
    for replay in stage.replays[case.name]:
        answer = replay.send(stage.cluster)
        problems = check(replay, answer, stage.suite.policy_names, stage.paths)
        if problems:
            failures.append(f"{replay.case.id}\n  request: {replay.describe()}\n  answer: {answer}\n  - "
                            + "\n  - ".join(problems))
    if failures:
        deviation = stage.deviations.get(case.name)
        if deviation is not None:
            failures.insert(0, f"(replayed this way because {deviation.reason})")
        pytest.fail("\n".join(failures), pytrace=False)


# --- CONNECT: no example has one ------------------------------------------------------------------------------

VAULT_POLICY = "e2e-hands-off-the-vault"


def test_connect_to_pods_exec_and_attach_is_judged_before_the_kubelet_is_reached(
        cluster: Cluster, policies: Policies, namespace: Callable[..., str]) -> None:
    """`kubectl exec` and `kubectl attach` are CONNECTs to pods/exec and pods/attach, whose object is the options
    (``container``, ``command``). The API server asks admission before it looks for the pod's node, so a denial
    comes back as such (403 from the webhook), while an allowed request gets as far as the node lookup, which
    fails here for lack of a kubelet (400, "does not have a host assigned", no webhook in the message).

    The same policy refuses `kubectl debug --target=vault` (pods/ephemeralcontainers UPDATE); that denial shows
    that the API server uses the policy's webhook configuration before the CONNECTs are sent.
    """
    ns = namespace()
    image = cluster.settings.pod_image
    keeper = pod("keeper", namespace=ns, containers=[container("app", image), container("vault", image)])
    created = cluster.create(pykube.Pod, keeper)
    assert created.ok, str(created)
    policies.apply(policy_body(
        VAULT_POLICY,
        description="Nobody execs into, attaches to, or debugs the vault container.",
        match={"resources": [
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/exec", "pods/attach"],
             "operations": ["CONNECT"]},
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/ephemeralcontainers"],
             "operations": ["UPDATE"]},
        ]},
        validations=[
            {"expression": "request.operation != 'CONNECT' || object.?container.orValue('') != 'vault'",
             "messageExpression": "'no ' + request.subResource + ' into the vault container of pod ' + request.name",
             "reason": "Forbidden"},
            {"expression": "request.operation == 'CONNECT' || !object.spec.?ephemeralContainers.orValue([])"
                           ".exists(c, c.?targetContainerName.orValue('') == 'vault')",
             "messageExpression": "'no debugging the vault container of pod ' + request.name", "reason": "Forbidden"},
        ]))

    def debug(target: str) -> Answer:
        container = {"name": f"debug-{target}", "image": image, "targetContainerName": target}
        return send(cluster, "PATCH", pykube.Pod, "keeper", namespace=ns, subresource="ephemeralcontainers",
                    body=[{"op": "add", "path": "/spec/ephemeralContainers", "value": [container]}],
                    params={"dryRun": "All"}, content_type="application/json-patch+json")

    debug_vault = eventually(lambda: debug("vault"), lambda a: not a.ok, "kubectl debug --target=vault to be refused",
                             cluster.settings.timeout)
    assert debug_vault.status == 403, str(debug_vault)
    assert f'AdmissionPolicy "{VAULT_POLICY}" denied the request: no debugging the vault container of pod keeper' in (
        debug_vault.message), str(debug_vault)
    assert debug("app").ok

    def connect(subresource: str, container: str) -> Answer:
        return send(cluster, "POST", pykube.Pod, "keeper", namespace=ns, subresource=subresource,
                    params={"container": container, "command": "sh", "stdin": "true", "stdout": "true"})

    for subresource in ("exec", "attach"):
        allowed = connect(subresource, "app")
        assert allowed.status == 400, f"{subresource} into app: {allowed}"
        assert "pod keeper does not have a host assigned" in allowed.message, str(allowed)
        assert "admission webhook" not in allowed.message, str(allowed)

        # A CONNECT's object has no labels: the routed entry for it must carry no objectSelector,
        # or the API server never calls the webhook and this reaches the node lookup instead.
        denied = connect(subresource, "vault")
        assert denied.status == 403, f"{subresource} into vault: {denied}"
        assert "admission webhook" in denied.message, str(denied)
        assert (f'AdmissionPolicy "{VAULT_POLICY}" denied the request: '
                f"no {subresource} into the vault container of pod keeper") in denied.message, str(denied)
