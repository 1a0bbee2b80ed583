"""End-to-end benchmark: real requests through a real API server, with and without the operator.

    KUBEBUILDER_ASSETS=... python bench/e2e.py            # everything, about 10 minutes on 2 cores
    KUBEBUILDER_ASSETS=... python bench/e2e.py --quick    # shorter runs, 100 generated policies: ~2 minutes
    KUBEBUILDER_ASSETS=... python bench/e2e.py --rounds 4 --no-scale-out --no-generated   # none/vap/pss/native*

What users feel is not the webhook's own throughput (bench/run.py) but what it adds to their
``kubectl apply``: latency, and CPU on the API server and the operator. So: an envtest control
plane (tests/e2e/envtest.py, with 1.28's ValidatingAdmissionPolicy gate on), a load generator
in its own process (apiload.py: the apiobjects.py mix of dry-run creates, updates and deletes,
checking every answer), and these scenarios, each at every concurrency level for a bounded time:

    none            no webhook configuration, no VAP: the baseline
    vap             the same Pod Security checks as Kubernetes' own ValidatingAdmissionPolicy
    pss             the operator (one process, one core) with examples/pod-security-baseline + -restricted
                    (spec.native: Never: the webhook path)
    native          the same two policies with spec.native: Auto: enforced by the ValidatingAdmissionPolicies
                    the operator generates (docs/vap.md, "Native enforcement"), the operator running but not called
    native-same-cel bench/pss-vap.yaml's Pod checks as one AdmissionPolicy, enforced by the objects the
                    operator generates: the same CEL as vap, so the ratio is the generator's own cost
    scale-out       pss with one, then two operator processes behind one proxy (highest level only)
    pss+generated   pss plus N policies that match none of the requests (1,000; --quick: 100)

Each figure is a ratio to the baseline of the same run. The last line is one JSON object with
every figure and the targets (bench/README.md).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from typing import IO, Any

import requests
import yaml

import apiobjects
import e2e_report
import policies
import vap
from common import CLIENT_CORE, SERVER_CORE, peak_rss_mb, rss_mb
from e2e_cluster import POLICIES, PROBE, WEBHOOK_CONFIG, Api, ControlPlane, ControlPlaneError, Replica, SetupError
from procs import ChildError, run_to_end, wait_idle
from run import machine

PODS = f"/api/v1/namespaces/{apiobjects.NAMESPACE}/pods{apiobjects.DRY_RUN}"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{apiobjects.NAMESPACE}/deployments{apiobjects.DRY_RUN}"


@dataclasses.dataclass(frozen=True)
class Plan:
    quick: bool
    levels: tuple[int, ...]   # concurrency levels (closed loop), each measured once per scenario
    warmup: float             # seconds of load before each measured window
    duration: float           # seconds measured per level
    rounds: int               # none, vap, pss and native measured this many times, in turn (drift hits all alike)
    idle: float               # seconds of no load before each scenario: the processes' idle CPU rate
    generated: int            # non-matching policies of the last scenario (0: no such scenario)
    scale_out: bool
    native: bool = True


FULL = Plan(quick=False, levels=(1, 8, 32), warmup=2.0, duration=8.0, rounds=3, idle=3.0, generated=1000,
            scale_out=True)
QUICK = Plan(quick=True, levels=(1, 8, 32), warmup=1.0, duration=4.0, rounds=1, idle=1.5, generated=100,
             scale_out=True)


@dataclasses.dataclass
class Bench:
    plan: Plan
    api: Api
    plane: ControlPlane
    workdir: pathlib.Path
    log: IO[str]
    stack: contextlib.ExitStack
    rounds: dict[str, dict[int, list[dict[str, Any]]]] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def pids(self, **more: int) -> dict[str, int]:
        return {"kube-apiserver": self.plane.pid("kube-apiserver"), "etcd": self.plane.pid("etcd"), **more}

    def load(self, concurrency: int, pids: dict[str, int], expect_denials: bool) -> dict[str, Any]:
        args = ["--server", self.api.server, "--ca", self.api.ca, "--cert", self.api.cert, "--key", self.api.key,
                "--concurrency", str(concurrency), "--warmup", str(self.plan.warmup),
                "--duration", str(self.plan.duration), "--core", str(CLIENT_CORE),
                *[f"--pid={name}={pid}" for name, pid in pids.items()]]
        if expect_denials:
            args.append("--expect-denials")
        return run_to_end("apiload", "apiload.py", args, self.plan.warmup + self.plan.duration + 120)

    def measure(self, name: str, pids: dict[str, int], expect_denials: bool,
                levels: tuple[int, ...] | None = None) -> e2e_report.Scenario:
        """Every level once; each result also gets ``cpu_net``: its CPU seconds less what the
        process burns idle (watches, controllers, leases) over the same time, which is not the
        requests' doing and would otherwise be charged more per request the slower a scenario is."""
        idle = e2e_report.idle_rates(pids, self.plan.idle)
        results: e2e_report.Scenario = {}
        for level in levels or self.plan.levels:
            before = self.vap_plugin()
            result = self.load(level, pids, expect_denials)
            after = self.vap_plugin()
            result["vap_plugin"] = {key: round(after[key] - before[key], 6) for key in after}
            result["idle_cpu_per_s"] = idle
            result["cpu_net"] = {n: None if v is None else round(v - idle.get(n, 0.0) * result["seconds"], 3)
                                 for n, v in result["cpu_seconds"].items()}
            operators = [rss_mb(pid) or 0.0 for n, pid in pids.items() if n.startswith("operator")]
            result["operator_rss_mb"] = round(sum(operators), 1) if operators else None
            results[level] = result
            self.rounds.setdefault(name, {}).setdefault(level, []).append(result)
            baseline = (self.rounds.get(e2e_report.BASELINE) or {}).get(level)
            e2e_report.print_level(name, result, baseline[-1] if baseline else None)
        return results

    def vap_plugin(self) -> dict[str, float]:
        """The API server's ValidatingAdmissionPolicy plugin so far: seconds spent and calls (its own histogram,
        every request it saw, warm-up and background ones included): the CEL side without the rest of the request."""
        status, text = self.api.call("GET", "/metrics")
        return e2e_report.vap_plugin_totals(text if status == 200 and isinstance(text, str) else "")

    # --- what the API server answers now --------------------------------------------------------

    def probe(self) -> dict[str, int]:
        """HTTP status of a dry-run create of the non-compliant Pod, the compliant one and the Deployment."""
        return {"noncompliant_pod": self.api.call("POST", PODS, apiobjects.pod("probe", compliant=False))[0],
                "pod": self.api.call("POST", PODS, apiobjects.pod("probe"))[0],
                "deployment": self.api.call("POST", DEPLOYMENTS, apiobjects.deployment("probe"))[0]}

    def wait_enforced(self, enforced: bool, what: str) -> dict[str, int]:
        """Until the non-compliant Pod is denied (or admitted), and the compliant objects admitted."""
        answer: dict[str, int] = {}

        def ready() -> bool:
            answer.update(self.probe())
            denied = answer["noncompliant_pod"] in (403, 422)
            return denied == enforced and answer["pod"] == 201 and answer["deployment"] == 201
        try:
            self.api.wait(what, ready, timeout=90.0, interval=0.5)
        except SetupError as exc:
            raise SetupError(f"{exc}; last answers (HTTP status): {answer}") from None
        return dict(answer)


# --- scenarios -----------------------------------------------------------------------------------

def setup(bench: Bench) -> None:
    """The CRDs (ours, and the generated policies' 30), the namespaces, the PATCH/DELETE targets."""
    api = bench.api
    api.apply_crds([api.admission_policy_crd(), *policies.crds()])
    api.ensure_namespace("admission-policy-bench")
    api.ensure_namespace(apiobjects.NAMESPACE)
    for path, body in apiobjects.stored():
        api.create(path, body)


def scenario_vap(bench: Bench) -> None:
    print("\n== vap: ValidatingAdmissionPolicy with the same Pod Security checks (bench/pss-vap.yaml)", flush=True)
    for path, body in vap.objects(bench.plane.version):
        bench.api.create(path, body)
    checks = bench.wait_enforced(True, "the VAP to deny the non-compliant Pod and admit the compliant ones")
    bench.info["vap_checks"] = checks
    print(f"   enforced: non-compliant Pod HTTP {checks['noncompliant_pod']}, compliant Pod {checks['pod']},"
          f" Deployment {checks['deployment']}", flush=True)
    bench.measure("vap", bench.pids(), expect_denials=True)
    for path, body in reversed(vap.objects(bench.plane.version)):
        bench.api.delete(f"{path}/{body['metadata']['name']}")
    bench.wait_enforced(False, "the VAP to be gone")


def start_operator(bench: Bench, name: str, core: int, advertise_port: int | None = None) -> Replica:
    replica = Replica(name, core, bench.plane.kubeconfig, bench.workdir, bench.log, advertise_port=advertise_port)
    bench.stack.callback(replica.stop)
    replica.wait_ready()
    return replica


def settle(bench: Bench, replicas: list[Replica], what: str) -> None:
    """Enforced, and every replica idle (its backlog of status writes and events done)."""
    checks = bench.wait_enforced(True, what)
    waits = [wait_idle(r.child, timeout=120) for r in replicas]
    print(f"   enforced (non-compliant Pod HTTP {checks['noncompliant_pod']}); idle after {max(waits)} s", flush=True)


def scenario_pss(bench: Bench, index: int) -> Replica:
    """The first round creates the policies; later ones start the operator on them again."""
    print("\n== pss: the operator (one process, core 0), pod-security-baseline + -restricted", flush=True)
    operator = start_operator(bench, f"operator-{index}", SERVER_CORE)
    bodies = policies.with_native(policies.example_set("pss"), "Never")
    if index == 0:
        for body in bodies:
            bench.api.create(POLICIES, body)
    seconds = bench.api.wait_active([b["metadata"]["name"] for b in bodies], timeout=120)
    print(f"   {len(bodies)} policies Active after {seconds} s", flush=True)
    settle(bench, [operator], "the operator to deny the non-compliant Pod")
    bench.measure("pss", bench.pids(operator=operator.pid), expect_denials=True)
    bench.info.setdefault("operator_rss_mb", {})[f"pss, round {index + 1}"] = round(rss_mb(operator.pid) or 0.0, 1)
    return operator


def scenario_native(bench: Bench, operator: Replica) -> None:
    """The pss policies switched to ``spec.native: Auto`` on the running operator, measured once both
    are enforced by their generated objects; then switched back, the generated objects deleted."""
    print("\n== native: the same two policies with spec.native: Auto, judged by the ValidatingAdmissionPolicies"
          " the operator generates (the operator runs, idle)", flush=True)
    names = [b["metadata"]["name"] for b in policies.example_set("pss")]
    version = vap.api_version(bench.plane.version)
    for name in names:
        bench.api.patch(f"{POLICIES}/{name}", {"spec": {"native": "Auto"}})
    seconds = bench.api.wait_enforced_by(names, "Native", timeout=180)
    generated = bench.api.generated(version)
    print(f"   enforcedBy Native after {seconds} s: {', '.join(sorted(g['metadata']['name'] for g in generated))}",
          flush=True)
    checks = bench.wait_enforced(True, "the generated objects to deny the non-compliant Pod")
    judged = judged_by(bench)
    print(f"   denied by: {judged}", flush=True)
    if not (bench.workdir / "generated.yaml").exists():   # the first round's, for --keep
        (bench.workdir / "generated.yaml").write_text(yaml.safe_dump_all(generated, sort_keys=False))
    native_info = bench.info.setdefault("native", {"checks": checks, "denied_by": judged, "switch_s": []})
    native_info["switch_s"].append(seconds)
    waited = wait_idle(operator.child, timeout=120)
    print(f"   operator idle after {waited} s; webhook rules left: {webhook_rules(bench)}", flush=True)
    bench.measure(e2e_report.NATIVE, bench.pids(operator=operator.pid), expect_denials=True)
    for name in names:
        bench.api.patch(f"{POLICIES}/{name}", {"spec": {"native": "Never"}})
    bench.api.wait_enforced_by(names, "Webhook", timeout=180)
    bench.api.wait("the generated objects to be deleted", lambda: not bench.api.generated(version), timeout=120)
    settle(bench, [operator], "the webhook to deny the non-compliant Pod again")


def scenario_native_same_cel(bench: Bench, operator: Replica) -> None:
    """pss-vap.yaml's own checks as one AdmissionPolicy, enforced by the objects the operator
    generates: against ``vap``, the same CEL, so the ratio is what generating costs (the examples'
    ``native`` ratio is also their CEL's). The pss policies are deleted meanwhile (a policy cannot be
    switched off otherwise), and created again afterwards."""
    print("\n== native-same-cel: bench/pss-vap.yaml's Pod checks as one AdmissionPolicy with spec.native: Auto,"
          " judged by the objects the operator generates (the operator runs, idle)", flush=True)
    pss = policies.with_native(policies.example_set("pss"), "Never")
    paths = [f"{POLICIES}/{body['metadata']['name']}" for body in pss]
    for path in paths:
        bench.api.delete(path)
    bench.api.wait("the pss policies to be deleted", lambda: all(bench.api.call("GET", p)[0] == 404 for p in paths))
    bench.wait_enforced(False, "the pss policies to be gone")
    version = vap.api_version(bench.plane.version)
    bench.api.create(POLICIES, vap.same_cel_policy())
    seconds = bench.api.wait_enforced_by([vap.SAME_CEL_NAME], "Native", timeout=180)
    bench.wait_enforced(True, "the generated objects to deny the non-compliant Pod")
    judged = judged_by(bench)
    print(f"   enforcedBy Native after {seconds} s; denied by: {judged}", flush=True)
    bench.info.setdefault("native_same_cel", {"denied_by": judged, "switch_s": []})["switch_s"].append(seconds)
    print(f"   operator idle after {wait_idle(operator.child, timeout=120)} s", flush=True)
    bench.measure(e2e_report.SAME_CEL, bench.pids(operator=operator.pid), expect_denials=True)
    bench.api.delete(f"{POLICIES}/{vap.SAME_CEL_NAME}")
    bench.api.wait("the generated objects to be deleted", lambda: not bench.api.generated(version), timeout=120)
    for body in pss:
        bench.api.create(POLICIES, body)
    bench.api.wait_active([body["metadata"]["name"] for body in pss], timeout=120)
    settle(bench, [operator], "the webhook to deny the non-compliant Pod again")


def judged_by(bench: Bench) -> dict[str, str]:
    """Who denied the non-compliant Pod and a Deployment of it: the generated objects must be the ones
    judging (``ap.policy.*`` for the Pod, ``ap.podtemplate.*`` for the template), not the webhook."""
    bad = apiobjects.deployment("probe-bad")
    bad["spec"]["template"]["spec"] = apiobjects.pod("probe-bad", compliant=False)["spec"]
    answers = {"pod": (bench.api.call("POST", PODS, apiobjects.pod("probe", compliant=False)), "ap.policy."),
               "deployment": (bench.api.call("POST", DEPLOYMENTS, bad), "ap.podtemplate.")}
    messages = {}
    for what, ((status, answer), prefix) in answers.items():
        message = answer.get("message", "") if isinstance(answer, dict) else str(answer)
        if status not in (403, 422) or f"ValidatingAdmissionPolicy '{prefix}" not in message:
            raise SetupError(f"the non-compliant {what} was not denied by a generated {prefix}* object:"
                             f" HTTP {status}: {message}")
        messages[what] = message[:160]
    return messages


def webhook_rules(bench: Bench) -> list[str]:
    """The resources the operator's validating webhooks still route to it (its own, not the policies')."""
    status, answer = bench.api.call(
        "GET", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_CONFIG}")
    if status != 200:
        return []
    return sorted({resource for hook in answer.get("webhooks") or [] for rule in hook.get("rules") or []
                   for resource in rule.get("resources") or []})


def unroute(bench: Bench, operator: Replica) -> None:
    """Stop the operator and delete its webhook configurations (it leaves them on exit, as it
    should in a cluster) and its native probe: the next round's baseline has no webhook nor VAP at all."""
    operator.stop()
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        bench.api.delete(f"/apis/admissionregistration.k8s.io/v1/{kind}/{WEBHOOK_CONFIG}")
    api = f"/apis/{vap.api_version(bench.plane.version)}"
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        bench.api.delete(f"{api}/{kind}/{PROBE}")
    bench.wait_enforced(False, "the webhook configurations to be gone")


def scenario_scale_out(bench: Bench, single: Replica) -> None:
    """Two replicas behind the proxy (core 0 and core 1), then one, at the highest level.

    Two first: the API server keeps its connections, so a replica added later would get only the
    connections opened after it came; stopping one sends its connections to the other."""
    from replicas import TcpProxy  # tests/e2e (on sys.path through e2e_cluster)

    top = max(bench.plan.levels)
    print(f"\n== scale-out: two operator processes (cores 0 and 1) behind one TCP proxy, then one; c={top}",
          flush=True)
    single.stop()
    proxy = TcpProxy()
    proxy.start()
    bench.stack.callback(proxy.stop)
    first = start_operator(bench, "replica-0", SERVER_CORE, proxy.port)
    second = start_operator(bench, "replica-1", CLIENT_CORE, proxy.port)
    proxy.backends = [first.listen_port, second.listen_port]
    settle(bench, [first, second], "two replicas to deny the non-compliant Pod")
    two = bench.measure("scale-2", bench.pids(operator=first.pid, operator_1=second.pid, proxy=os.getpid()), True,
                        (top,))
    connections = dict(proxy.connections)
    second.stop()
    proxy.backends = [first.listen_port]
    settle(bench, [first], "one replica behind the proxy to deny the non-compliant Pod")
    one = bench.measure("scale-1", bench.pids(operator=first.pid, proxy=os.getpid()), True, (top,))
    bench.info["scale_out"] = {"concurrency": top, "one": one[top], "two": two[top],
                               "ratio": round(two[top]["rps"] / one[top]["rps"], 3) if one[top]["rps"] else None,
                               "connections_with_two": {"replica-0": connections.get(first.listen_port, 0),
                                                        "replica-1": connections.get(second.listen_port, 0)}}
    first.stop()


def scenario_generated(bench: Bench) -> None:
    count = bench.plan.generated
    print(f"\n== pss+generated: a fresh operator (core 0), pss + {count} non-matching policies", flush=True)
    operator = start_operator(bench, "operator-generated", SERVER_CORE)
    bodies = policies.generated(count)
    started = time.monotonic()
    for body in bodies:
        bench.api.create(POLICIES, body)
    names = [b["metadata"]["name"] for b in bodies + policies.example_set("pss")]
    seconds = bench.api.wait_active(names, timeout=600)
    print(f"   {len(names)} policies Active {round(time.monotonic() - started, 1)} s after the first create"
          f" (the last {seconds} s of it waiting)", flush=True)
    settle(bench, [operator], "the operator to deny the non-compliant Pod")
    bench.measure("pss+generated", bench.pids(operator=operator.pid), expect_denials=True)
    rss = bench.info.setdefault("operator_rss_mb", {})
    rss[f"pss+{count}"] = round(rss_mb(operator.pid) or 0.0, 1)
    rss[f"pss+{count} peak"] = round(peak_rss_mb(operator.pid) or 0.0, 1)


# --- main ----------------------------------------------------------------------------------------

def run_all(plan: Plan, assets: pathlib.Path, workdir: pathlib.Path, info: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    with (workdir / "children.log").open("w") as log, contextlib.ExitStack() as stack:
        plane = ControlPlane(assets, workdir=workdir / "plane")   # the VAP served as its version needs
        (workdir / "plane").mkdir()
        stack.callback(plane.stop)
        print(f"== starting the control plane from {assets}", flush=True)
        plane.start()
        bench = Bench(plan, Api(plane.kubeconfig), plane, workdir, log, stack)
        setup(bench)
        for index in range(plan.rounds):
            print(f"\n######## round {index + 1}/{plan.rounds}", flush=True)
            print("\n== none: no webhook configuration, no VAP", flush=True)
            bench.measure("none", bench.pids(), expect_denials=False)
            scenario_vap(bench)
            operator = scenario_pss(bench, index)
            if plan.native:
                scenario_native(bench, operator)
                scenario_native_same_cel(bench, operator)
            if index < plan.rounds - 1:
                unroute(bench, operator)
        if plan.scale_out:
            scenario_scale_out(bench, operator)
        else:
            operator.stop()
        if plan.generated:
            scenario_generated(bench)
    info["loadavg_end"] = os.getloadavg()[0]
    levels = list(plan.levels)
    scenarios = {name: {level: e2e_report.combine(results) for level, results in per_level.items()}
                 for name, per_level in bench.rounds.items() if not name.startswith("scale-")}
    for name in e2e_report.NATIVES:
        if name in scenarios:
            bench.info[e2e_report.versus_key(name)] = {
                level: e2e_report.versus(scenarios, bench.rounds, name, e2e_report.VAP, level) for level in levels}
    met = e2e_report.targets(scenarios, levels)
    e2e_report.print_summary(scenarios, levels, met, bench.info)
    mismatched = sum(r["mismatches"] for per_level in bench.rounds.values() for rs in per_level.values() for r in rs)
    print(f"   answers as the policies say: {'yes' if not mismatched else f'NO ({mismatched} mismatches)'}")
    return {"quick": plan.quick, "plan": dataclasses.asdict(plan), "machine": info,
            "scenarios": {name: {str(level): result for level, result in per_level.items()}
                          for name, per_level in scenarios.items()},
            "info": bench.info, "mismatches": mismatched, "targets": met,
            "elapsed_s": round(time.monotonic() - started, 1)}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about 2 minutes: shorter runs, 100 generated policies")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (children.log, plane logs)")
    parser.add_argument("--no-scale-out", action="store_true", help="skip the two-replica runs")
    parser.add_argument("--no-generated", action="store_true", help="skip pss+generated")
    parser.add_argument("--no-native", action="store_true", help="skip native (e.g. where the policies cannot port)")
    parser.add_argument("--rounds", type=int, help="rounds of none, vap, pss and native (default: 3; --quick: 1)")
    args = parser.parse_args()
    assets = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
    if not assets:
        sys.exit("error: set KUBEBUILDER_ASSETS to a directory holding etcd, kube-apiserver, "
                 "kube-controller-manager and kubectl (see tests/e2e/README.md)")
    plan = QUICK if args.quick else FULL
    plan = dataclasses.replace(plan, scale_out=not args.no_scale_out, native=not args.no_native,
                               rounds=args.rounds or plan.rounds, generated=0 if args.no_generated else plan.generated)
    info = machine("operator")
    if len(info["cores"]) < 2:
        print("warning: fewer than 2 cores: operator, API server and client all share one")
    if info["loadavg_start"] > 0.5:
        print(f"warning: load average {info['loadavg_start']:.2f} before starting: other processes share the"
              " machine; compare CPU per request (robust) rather than throughput (not)")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="ap-e2e-bench-"))
    signal.signal(signal.SIGTERM, _interrupt)   # as Ctrl-C: unwind, stopping every child on the way
    ok = False
    try:
        result = run_all(plan, pathlib.Path(assets).expanduser(), workdir, info)
        ok = True
    except (ControlPlaneError, SetupError, ChildError, requests.RequestException) as exc:
        sys.exit(f"error: {exc}\n(logs: {workdir})")
    except KeyboardInterrupt:
        sys.exit(f"interrupted; every child was stopped (logs: {workdir})")
    finally:
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif ok:
            print(f"work directory: {workdir}", file=sys.stderr)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
