"""The engine alone, no HTTP: what one admission request costs, and where the time goes.

    python bench/engine_micro.py [--seconds 2] [--generated 1000] [--against REV]

The split uses only public functions, without editing product code:

1. ``evaluate()`` is timed as a whole (the webhook's engine cost per request);
2. one instrumented call records every ``new_activation`` it makes (with its bindings) and
   every CEL program it runs on which activation (by wrapping the two names the evaluation
   module calls, in this process only);
3. those are replayed and timed on their own: building the same activations (activation
   build), and building them and running the same programs on them (minus the former: CEL
   evaluation, including the conversion of the bound values on first read);
4. the rest of ``evaluate()`` is the engine's own work (matching, scopes, the Decision); for
   mutations, ``patching.diff`` between the original and the mutated object (the patch the
   response carries) is timed separately, as is ``build_response``.

Also: compile time, memory and per-request lookup cost with many non-matching policies, and
the memory a fresh interpreter takes for the imports alone.

``--against REV`` prints only the Pod Security Pod CREATE (``evaluate()`` per request) of this
tree and of the package at git revision REV (checked out in a temporary worktree, imported in
a child process), measured in turns in the same run, and their ratio: that a change to the
CEL environment costs that path nothing.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

import policies
import reviews
from admission_policy import api, cel
from admission_policy.engine import (
    CompiledPolicy,
    Phase,
    PolicySet,
    build_response,
    compile_policy,
    decode_review,
    evaluate,
    parse_review,
)
from admission_policy.engine.patching import diff
from admission_policy.operator.sources import SourceCache, Sources
from common import EXAMPLES, SERVER_CORE, emit, pin, rss_mb

NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "default", "labels": {"kubernetes.io/metadata.name": "default"}}}


def per_call_us(fn: Callable[[], Any], seconds: float, repeats: int = 5) -> float:
    """Microseconds per call: the best mean of ``repeats`` timings over ``seconds`` in all.

    The best, not the average (as timeit advises): what disturbs a timing (other processes,
    a garbage collection) only ever adds to it.
    """
    fn()
    return min(_mean_us(fn, seconds / repeats) for _ in range(repeats))


def _mean_us(fn: Callable[[], Any], seconds: float) -> float:
    calls, started = 0, time.perf_counter()
    deadline = started + seconds
    batch = 1
    while time.perf_counter() < deadline:
        for _ in range(batch):
            fn()
        calls += batch
        batch = min(batch * 2, 64)   # few clock reads for fast functions, little overshoot for slow ones
    return (time.perf_counter() - started) / calls * 1e6


def compile_all(bodies: list[dict[str, Any]]) -> list[CompiledPolicy]:
    return [compile_policy(api.parse_policy(body)) for body in bodies]


class Recorder:
    """Records the activations and CEL runs of one ``evaluate()`` call (see module doc)."""

    def __init__(self) -> None:
        self.bindings: list[dict[str, Any]] = []
        self.runs: list[tuple[cel.CompiledExpression, int]] = []   # (program, activation index)
        self._activations: dict[int, int] = {}                      # id(activation) → index

    def record(self, policy_set: PolicySet, request: Any, phase: Phase) -> None:
        # The two names evaluate() calls, swapped for recording ones in this process only; imported
        # here, as ``--against`` runs this file on older revisions, without ``engine.scope``.
        from admission_policy.engine import scope as scope_module

        original_new = getattr(scope_module, "new_activation")  # noqa: B009  (not re-exported)
        original_eval = cel.CompiledExpression.evaluate
        recorder = self

        def new_activation(data: Any) -> Any:
            activation = original_new(data)
            recorder._activations[id(activation)] = len(recorder.bindings)
            recorder.bindings.append(dict(data))
            return activation

        def evaluate_expression(expression: cel.CompiledExpression, activation: Any, **options: Any) -> Any:
            recorder.runs.append((expression, recorder._activations[id(activation)]))
            return original_eval(expression, activation, **options)

        setattr(scope_module, "new_activation", new_activation)  # noqa: B010
        setattr(cel.CompiledExpression, "evaluate", evaluate_expression)  # noqa: B010
        try:
            evaluate(policy_set, request, NAMESPACE, phase)
        finally:
            setattr(scope_module, "new_activation", original_new)  # noqa: B010
            setattr(cel.CompiledExpression, "evaluate", original_eval)  # noqa: B010

    def activation_us(self, seconds: float) -> float:
        return per_call_us(lambda: [cel.new_activation(b) for b in self.bindings], seconds)

    def build_and_run_us(self, seconds: float) -> float:
        """Fresh activations and every recorded program on them, as evaluate() does.

        Fresh each time: an activation converts the values it wraps when a program first
        reads them, so programs replayed on a reused activation would hide that conversion.
        """
        runs = self.runs

        def run_all() -> None:
            activations = [cel.new_activation(b) for b in self.bindings]
            for expression, index in runs:
                try:  # noqa: SIM105  (contextlib.suppress would add its own cost to what is timed)
                    expression.evaluate(activations[index])
                except cel.CelEvaluationError:
                    pass   # the engine handles these too; the cost is the same
        return per_call_us(run_all, seconds)


def breakdown(policy_set: PolicySet, review: dict[str, Any], phase: Phase, seconds: float) -> dict[str, Any]:
    """Per-request microseconds for one policy set and request: total and parts."""
    encoded = reviews.encode(review)
    request = parse_review(review)
    decision = evaluate(policy_set, request, NAMESPACE, phase)
    recorder = Recorder()
    recorder.record(policy_set, request, phase)
    result: dict[str, Any] = {
        "json_decode_us": per_call_us(lambda: decode_review(encoded), seconds),   # what the webhook runs
        "parse_review_us": per_call_us(lambda: parse_review(review), seconds),
        "candidates_us": per_call_us(lambda: policy_set.candidates(request), seconds),
        "evaluate_us": per_call_us(lambda: evaluate(policy_set, request, NAMESPACE, phase), seconds),
        "activations": len(recorder.bindings),
        "activation_build_us": recorder.activation_us(seconds),
        "cel_programs": len(recorder.runs),
        "cel_evaluation_us": recorder.build_and_run_us(seconds),
        "build_response_us": per_call_us(lambda: build_response(decision, request.uid), seconds),
        "allowed": decision.allowed,
        "patch_ops": len(decision.patch),
    }
    result["cel_evaluation_us"] -= result["activation_build_us"]
    if decision.patch:
        patched = decision.patched_object
        result["patch_computation_us"] = per_call_us(lambda: diff(request.object, patched), seconds)
    else:
        result["patch_computation_us"] = 0.0   # validations only: no patch is computed
    result["engine_other_us"] = (result["evaluate_us"] - result["activation_build_us"]
                                 - result["cel_evaluation_us"] - result["patch_computation_us"])
    return {key: round(value, 2) if isinstance(value, float) else value for key, value in result.items()}


def scale(generated: int, seconds: float) -> dict[str, Any]:
    """Compile time and memory of many policies, and whether lookup cost stays flat."""
    gc.collect()
    before = rss_mb_self()
    started = time.perf_counter()
    compiled = compile_all(policies.generated(generated))
    compile_s = time.perf_counter() - started
    gc.collect()
    after = rss_mb_self()
    pss = compile_all(policies.example_set("pss"))
    small, large = PolicySet(pss), PolicySet(pss + compiled)
    request = parse_review(reviews.pss_pod_create())
    return {
        "generated": generated,
        "compile_ms_per_policy": round(compile_s / max(generated, 1) * 1000, 3),
        "rss_mb_per_100_policies": round((after - before) / max(generated, 1) * 100, 2),
        "candidates_us_pss_only": round(per_call_us(lambda: small.candidates(request), seconds), 2),
        "candidates_us_with_generated": round(per_call_us(lambda: large.candidates(request), seconds), 2),
        "evaluate_us_pss_only": round(per_call_us(
            lambda: evaluate(small, request, NAMESPACE, Phase.VALIDATE), seconds), 2),
        "evaluate_us_with_generated": round(per_call_us(
            lambda: evaluate(large, request, NAMESPACE, Phase.VALIDATE), seconds), 2),
    }


def image_rule(kind: str) -> dict[str, Any]:
    """One more policy on the PSS Pod's images, admitting it: the shipped plugin, or the nearest CEL."""
    body = policies.example("image-references")
    body["metadata"]["name"] = f"images-{kind}"
    if kind == "plugin":
        body["spec"]["validations"] = [{"plugin": {"name": "image-references", "config": {
            "requireDigest": False, "allowedRegistries": ["docker.io/nginxinc/"]}}}]
    else:   # a prefix check: what CEL can say, wrong for "docker.io/nginxinc/..." or a look-alike host
        body["spec"]["validations"] = [{"expression": "object.spec.containers.all(c, "
                                                      "c.image.startsWith('nginxinc/'))"}]
    return body


def plugin_cost(seconds: float) -> dict[str, Any]:
    """The PSS Pod with the image-references plugin beside the Pod Security set, next to CEL only."""
    pss = compile_all(policies.example_set("pss"))
    request = parse_review(reviews.pss_pod_create())
    result: dict[str, Any] = {}
    for case, extra in (("cel_only", []), ("cel_image_rule", [image_rule("cel")]),
                        ("image_plugin", [image_rule("plugin")])):
        policy_set = PolicySet(pss + compile_all(extra))
        decision = evaluate(policy_set, request, NAMESPACE, Phase.VALIDATE)
        assert decision.allowed, f"{case}: the PSS Pod must be admitted, got {decision}"
        result[f"{case}_us"] = round(per_call_us(
            lambda s=policy_set: evaluate(s, request, NAMESPACE, Phase.VALIDATE), seconds), 2)
        if decision.plugin_calls:   # the call as the engine records it: the median of 1,000
            calls = sorted(sum(c.seconds for c in evaluate(policy_set, request, NAMESPACE, Phase.VALIDATE).plugin_calls)
                           for _ in range(1_000))
            result["plugin_call_us"] = round(calls[len(calls) // 2] * 1e6, 2)
    return result


CONTEXT_SIZES = (100, 1_000, 5_000)


def context_list(seconds: float, count: int) -> dict[str, Any]:
    """A policy reading a context of ``count`` Deployments (one loop over them: CEL's budget is 10,000
    loop steps per evaluation, so examples/deployment-quota, three steps per Deployment, fits ~3,000)
    on a Deployment CREATE: per-request microseconds, printed next to the PSS Pod CREATE."""
    example = EXAMPLES / "deployment-quota"
    body = {"apiVersion": "policy-operator.dev/v1alpha1", "kind": "AdmissionPolicy", "metadata": {"name": "ctx"},
            "spec": {"match": {"resources": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                              "resources": ["deployments"], "operations": ["CREATE"]}]},
                     "context": [{"name": "deployments", "group": "apps", "version": "v1", "resource": "deployments",
                                  "scope": "RequestNamespace", "maxObjects": count}],
                     "validations": [{"expression": "context.deployments.all(d, d.spec.template.spec.containers[0]"
                                                    ".image != object.spec.template.spec.containers[0].image)",
                                      "message": "one Deployment per image"}]}}
    policy_set = PolicySet([compile_policy(api.parse_policy(body))])
    template = yaml.safe_load((example / "cluster" / "api.yaml").read_text())
    deployments = []
    for index in range(count):
        item = json.loads(json.dumps(template))
        item["metadata"]["name"] = f"app-{index}"
        item["spec"]["template"]["spec"]["containers"][0]["image"] = f"registry.acme.com/app-{index}:1"
        deployments.append(item)
    created = yaml.safe_load((example / "deployment-web-2.yaml").read_text())
    request = parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "operation": "CREATE", "namespace": "team-a", "name": "web", "object": created,
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"}, "userInfo": {"username": "u"}}})
    # What the operator's webhook reads: its watch-backed cache of the source (operator/sources.py).
    (entry,) = next(iter(policy_set)).policy.context
    cache = SourceCache(entry.source)
    for item in deployments:
        item["metadata"]["namespace"] = "team-a"
        cache.apply("ADDED", item)
    cache.loaded.set()
    inputs = Sources(None, None)
    inputs.caches[entry.source] = cache
    decision = evaluate(policy_set, request, NAMESPACE, Phase.VALIDATE, inputs=inputs)
    assert decision.allowed, decision.message
    return {"objects": count, "allowed": decision.allowed, "evaluate_us": round(per_call_us(
        lambda: evaluate(policy_set, request, NAMESPACE, Phase.VALIDATE, inputs=inputs), seconds, repeats=3), 1)}


def import_footprint() -> dict[str, float]:
    """RSS (MB) of a fresh interpreter after each import: what a server pays before any policy.

    Kopf imports kubernetes_asyncio.client (every API and model module) whenever it is
    installed, so the baselines pay for it too.
    """
    footprint = {}
    for label, statement in (("python", "pass"), ("kopf", "import kopf"),
                             ("kubernetes_asyncio", "import kubernetes_asyncio.client"),
                             ("operator", "import admission_policy.operator.handlers")):
        probe = f"{statement}\nimport gc; gc.collect()\nprint(open('/proc/self/status').read())"
        status = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        footprint[label] = round(int(status.split("VmRSS:")[1].split()[0]) / 1024, 1)
    return footprint


def rss_mb_self() -> float:
    return rss_mb(os.getpid()) or 0.0


def pss_pod_us(seconds: float) -> float:
    """evaluate() of the Pod Security set on its compliant Pod CREATE, per request."""
    pss = PolicySet(compile_all(policies.example_set("pss")))
    request = parse_review(reviews.pss_pod_create())
    assert evaluate(pss, request, NAMESPACE, Phase.VALIDATE).allowed
    return per_call_us(lambda: evaluate(pss, request, NAMESPACE, Phase.VALIDATE), seconds)


def against(revision: str, seconds: float, turns: int = 3) -> dict[str, Any]:
    """The PSS Pod path here and at ``revision``, in alternating child processes (see module doc)."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="engine-micro-") as scratch:
        worktree = Path(scratch) / "base"
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(worktree), revision],
                       check=True)
        try:
            packages = {"here": repo / "operator", revision: worktree / "operator"}
            figures: dict[str, list[float]] = {label: [] for label in packages}
            for _ in range(turns):
                for label, package in packages.items():
                    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package), str(repo / "bench")])}
                    out = subprocess.run([sys.executable, __file__, "--pss-only", "--seconds", str(seconds)],
                                         env=env, capture_output=True, text=True, check=True).stdout
                    figures[label].append(json.loads(out)["pss_pod_us"])
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(worktree)], check=True)
    here, base = statistics.median(figures["here"]), statistics.median(figures[revision])
    return {"pss_pod_us": {"here": round(here, 1), revision: round(base, 1)}, "ratio": round(here / base, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per measured function")
    parser.add_argument("--generated", type=int, default=1000)
    parser.add_argument("--against", metavar="REV", help="only the PSS Pod path, here and at git revision REV")
    parser.add_argument("--pss-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    pin(SERVER_CORE)
    if args.pss_only:
        emit(pss_pod_us=pss_pod_us(args.seconds))
        return
    if args.against:
        emit(**against(args.against, args.seconds))
        return
    pss = PolicySet(compile_all(policies.example_set("pss")))
    mutation = PolicySet(compile_all(policies.example_set("mutation")))
    pod_review = breakdown(pss, reviews.pss_pod_create(), Phase.VALIDATE, args.seconds)
    deployment_review = breakdown(pss, reviews.pss_deployment_create(), Phase.VALIDATE, args.seconds)
    emit(
        pss=pod_review,
        pss_deployment=deployment_review,
        pss_denied=breakdown(pss, reviews.pod_create(restricted=False), Phase.VALIDATE, args.seconds),
        mutation=breakdown(mutation, reviews.sidecar_pod_create(), Phase.MUTATE, args.seconds),
        plugin=plugin_cost(args.seconds),
        scale=scale(args.generated, args.seconds),
        context=[context_list(args.seconds, count) for count in CONTEXT_SIZES],
        import_rss_mb=import_footprint(),
    )


if __name__ == "__main__":
    main()
