"""Webhook benchmarks: the operator's real HTTPS server against two baselines, plus the engine alone.

    python bench/run.py            # everything, about 7 minutes on 2 cores
    python bench/run.py --quick    # the same steps, shorter and with 100 generated policies

Every server of the run is started first (each with its own emulated cluster, kmock through
the tests' harness), then measured in rounds, one server at a time on its own core, the load
generator on the other. Servers that are compared take turns within each round, so a drift of
the machine's speed over minutes (common on shared hosts) hits both sides of a ratio alike.
Figures are printed as they come; the last line is one JSON object with all of them and a
``targets`` map (see README.md).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

import report
import reviews
from common import CLIENT_CORE, REPO, SERVER_CORE, cores, free_port, peak_rss_mb, pin, rss_mb
from procs import Child, ChildError, post, run_to_end, running, wait_idle, wait_serving

ALL_REQUESTS = ("pss-pod-create", "deployment-update", "node-status-update", "sidecar-pod-create")
PSS_REQUEST = report.PSS_REQUEST


@dataclasses.dataclass(frozen=True)
class Plan:
    quick: bool
    rounds: int               # closed-loop runs per server and request, servers taking turns
    warmup: float             # seconds of load before measuring (new connections, TLS handshakes)
    duration: float           # seconds measured per closed-loop run
    open_warmup: float        # open loop: seconds at the offered rate before measuring
    open_duration: float      # open loop: seconds measured
    open_fractions: tuple[float, ...]   # open loop: requests/s offered, as fractions of the Kopf no-op's
    #                                     closed-loop throughput in this run; the first is the target's
    concurrency: int          # closed loop: requests in flight (keep-alive connections)
    generated: int            # non-matching policies installed in the "many policies" scenario
    tenants: int              # tenant policies on Pods, in other namespaces, in the "many tenants" scenario
    micro_seconds: float      # engine micro-bench: timing per measured function
    load_timeout: float       # seconds for the operator to bring every policy to Active


FULL = Plan(quick=False, rounds=4, warmup=1.0, duration=3.0, open_warmup=2.0, open_duration=8.0,
            open_fractions=(0.5, 0.75), concurrency=16, generated=1000, tenants=1000,
            micro_seconds=1.0, load_timeout=300.0)
QUICK = Plan(quick=True, rounds=1, warmup=0.5, duration=1.0, open_warmup=0.5, open_duration=2.0,
             open_fractions=(0.5,), concurrency=16, generated=100, tenants=100,
             micro_seconds=0.15, load_timeout=120.0)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    server: str                       # bare | kopf-noop | operator
    requests: tuple[str, ...]         # closed-loop runs, one per request kind and round
    policy_set: str = "none"          # policies.SETS
    generated: bool = False           # plus Plan.generated non-matching policies
    tenants: bool = False             # plus Plan.tenants tenant policies in other namespaces
    open_loop: bool = False           # plus an open-loop run of the PSS Pod CREATE
    path: str | None = None           # send every request here instead of its own webhook path


SCENARIOS = (
    Scenario("bare", "bare", ALL_REQUESTS, open_loop=True),
    # (b) has one validate handler: the mutating request goes to /validate too.
    Scenario("kopf-noop", "kopf-noop", ALL_REQUESTS, open_loop=True, path="/validate"),
    Scenario("pss", "operator", (PSS_REQUEST, "deployment-update", "node-status-update"), "pss", open_loop=True),
    Scenario("pss+generated", "operator", (PSS_REQUEST,), "pss", generated=True),
    Scenario("pss+tenants", "operator", (PSS_REQUEST,), "pss", tenants=True),
    Scenario("mutation", "operator", ("sidecar-pod-create",), "mutation"),
)


@dataclasses.dataclass
class Server:
    scenario: Scenario
    child: Child
    port: int
    cafile: str
    info: dict[str, Any]
    metrics_port: int = 0   # the operator's /metrics (its event loop's lag)


# --- starting the servers ----------------------------------------------------------------------

def start_server(scenario: Scenario, plan: Plan, workdir: pathlib.Path, log: IO[str],
                 stack: contextlib.ExitStack) -> Server:
    """The server, serving, idle, and (for the operator) with every policy Active."""
    print(f"== {scenario.name}: {describe(scenario, plan)}", flush=True)
    server = launch(scenario, plan, workdir, log, stack)
    first = scenario.requests[0]
    wait_serving(server.child, server.port, scenario.path or reviews.REQUESTS[first][1],
                 reviews.template(first), server.cafile, timeout=120)
    server.info["settle_seconds"] = wait_idle(server.child)
    server.info["rss_ready_mb"] = round(rss_mb(server.child.pid) or 0.0, 1)
    server.info["checks"] = sanity(server) if scenario.server == "operator" else {}
    loaded = (f", {server.info['policies']} policies Active after {server.info['load_seconds']} s"
              if "policies" in server.info else "")
    checks = "".join(f", {name}: {'ok' if ok else 'FAILED'}" for name, ok in server.info["checks"].items())
    print(f"   ready: RSS {server.info['rss_ready_mb']} MB{loaded}{checks}", flush=True)
    return server


def launch(scenario: Scenario, plan: Plan, workdir: pathlib.Path, log: IO[str],
           stack: contextlib.ExitStack) -> Server:
    port = free_port()
    baseline_certs = workdir / "baseline-certs"
    if scenario.server == "bare":
        child = stack.enter_context(running(Child(
            scenario.name, "servers.py", ["bare", "--port", str(port), "--cert-dir", str(baseline_certs)], log=log)))
        return Server(scenario, child, port, str(baseline_certs / "ca.crt"), {})

    generated = plan.generated if scenario.generated else 0
    tenants = plan.tenants if scenario.tenants else 0
    emulator = stack.enter_context(running(Child(
        f"{scenario.name} emulator", "emulator_host.py",
        ["--set", scenario.policy_set, "--generated", str(generated), "--tenants", str(tenants),
         "--timeout", str(plan.load_timeout)], log=log, stdin=True)))
    env = {"KUBECONFIG": emulator.read(60)["kubeconfig"]}
    if scenario.server == "kopf-noop":
        child = stack.enter_context(running(Child(
            scenario.name, "servers.py", ["kopf-noop", "--port", str(port), "--cert-dir", str(baseline_certs)],
            env=env, log=log)))
        return Server(scenario, child, port, str(baseline_certs / "ca.crt"), {})

    cert_dir = workdir / f"certs-{scenario.name}"
    env.update(operator_env(port, cert_dir))
    started = time.monotonic()
    child = stack.enter_context(running(Child(scenario.name, "servers.py", ["operator"], env=env, log=log)))
    active = emulator.read(plan.load_timeout + 30)
    if "error" in active:
        raise ChildError(f"{scenario.name}: {active['error']} ({active.get('phases')})")
    info = {"policies": active["active"], "load_seconds": round(time.monotonic() - started, 1)}
    return Server(scenario, child, port, str(cert_dir / "ca.crt"), info, int(env["AP_METRICS_PORT"]))


def operator_env(port: int, cert_dir: pathlib.Path) -> dict[str, str]:
    return {
        "AP_NAMESPACE": "admission-policy-system", "AP_LISTEN_HOST": "127.0.0.1", "AP_LISTEN_PORT": str(port),
        "AP_ADVERTISE_HOST": "127.0.0.1", "AP_HEALTH_PORT": str(free_port()), "AP_METRICS_PORT": str(free_port()),
        "AP_CERT_DIR": str(cert_dir), "AP_POD_NAME": "bench-0", "AP_LOG_LEVEL": "INFO",
    }


def sanity(server: Server) -> dict[str, bool]:
    """The operator enforces what it loaded: a non-compliant Pod is denied, the sidecar is patched in."""
    checks: dict[str, bool] = {}
    if server.scenario.policy_set == "pss":
        _, answer = post(server.port, "/validate", reviews.encode(reviews.pod_create(restricted=False)), server.cafile)
        checks["denies_noncompliant_pod"] = isinstance(answer, dict) and answer["response"]["allowed"] is False
    if server.scenario.policy_set == "mutation":
        _, answer = post(server.port, "/mutate", reviews.template("sidecar-pod-create"), server.cafile)
        checks["patches_sidecar_pod"] = isinstance(answer, dict) and bool(answer["response"].get("patch"))
    return checks


def describe(scenario: Scenario, plan: Plan) -> str:
    if scenario.server == "bare":
        return "(a) bare aiohttp over TLS, answers allowed: true"
    if scenario.server == "kopf-noop":
        return "(b) Kopf webhook server, one no-op @kopf.on.validate handler"
    extra = f" + {plan.generated} non-matching" if scenario.generated else ""
    extra += f" + {plan.tenants} tenant policies on Pods in {max(plan.tenants // 2, 1)} other namespaces" \
        if scenario.tenants else ""
    return f"the operator, policy set '{scenario.policy_set}'{extra}"


# --- measuring ---------------------------------------------------------------------------------

def load(server: Server, request: str, plan: Plan, *, open_rate: float | None = None) -> dict[str, Any]:
    """One load-generator run against ``server`` (open loop at ``open_rate``, if given); the sample
    answer is checked, then dropped."""
    args = ["--url", f"https://127.0.0.1:{server.port}", "--ca", server.cafile, "--request", request,
            "--server-pid", str(server.child.pid), "--concurrency", str(plan.concurrency)]
    if server.scenario.path:
        args += ["--path", server.scenario.path]
    if open_rate is not None:
        args += ["--mode", "open", "--rate", str(open_rate), "--warmup", str(plan.open_warmup),
                 "--duration", str(plan.open_duration)]
        timeout = plan.open_warmup + plan.open_duration + 60
    else:
        args += ["--warmup", str(plan.warmup), "--duration", str(plan.duration)]
        timeout = plan.warmup + plan.duration + 60
    result = run_to_end("loadgen", "loadgen.py", args, timeout)
    result["as_expected"] = answered_as_expected(server.scenario, result)
    result.pop("sample_response", None)
    return result


def answered_as_expected(scenario: Scenario, result: dict[str, Any]) -> bool:
    """Every request the bench sends is admitted; the mutating one comes back with a patch."""
    response = (result.get("sample_response") or {}).get("response") or {}
    expects_patch = scenario.server == "operator" and result["request"] == "sidecar-pod-create"
    patched = bool(response.get("patch")) or not expects_patch
    return bool(response.get("allowed")) and patched and result["errors"] == 0 and result["requests"] > 0


def measure(servers: dict[str, Server], plan: Plan) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Closed-loop rounds: every server and request once per round, starting one server later each time."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in servers}
    names = list(servers)
    for index in range(plan.rounds):
        print(f"\n== round {index + 1}/{plan.rounds}, closed loop, {plan.concurrency} connections", flush=True)
        for name in names[index % len(names):] + names[:index % len(names)]:
            for request in servers[name].scenario.requests:
                result = load(servers[name], request, plan)
                runs[name].setdefault(request, []).append(result)
                report.print_run(f"{name} {request}", result)
    return runs


def measure_open_loop(servers: dict[str, Server], plan: Plan,
                      saturation: float) -> dict[str, dict[str, dict[str, Any]]]:
    """``open-loop`` at the target's share of the Kopf no-op's saturation (its closed-loop
    throughput, ``saturation``, this run), then ``open-loop-<percent>pct`` at the other shares
    (figures only). Relative rates: an absolute one would sit below the knee on a fast machine and
    above it on a slow one (or in a slow phase of a shared one)."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for index, fraction in enumerate(plan.open_fractions):
        rate = round(fraction * saturation)
        key = "open-loop" if index == 0 else f"open-loop-{fraction * 100:.0f}pct"
        print(f"\n== open loop: {rate} {PSS_REQUEST}/s ({fraction:.0%} of the Kopf no-op's {saturation:.0f})"
              f" for {plan.open_duration:.0f} s", flush=True)
        for name, server in servers.items():
            if not server.scenario.open_loop or (index > 0 and server.scenario.server == "bare"):
                continue
            lag = report.loop_lag(server.metrics_port) if server.metrics_port else None
            result = load(server, PSS_REQUEST, plan, open_rate=rate)
            if lag is not None:
                result["loop_lag"] = report.lag_between(lag, report.loop_lag(server.metrics_port))
            result["fraction_of_noop_saturation"] = fraction
            results.setdefault(name, {})[key] = result
            report.print_run(name, result)
    return results


# --- main --------------------------------------------------------------------------------------

def machine(measured: str = "server") -> dict[str, Any]:
    """The machine and the code measured; ``measured`` names the core the measured process has."""
    return {"cores": cores(), f"{measured}_core": SERVER_CORE, "client_core": CLIENT_CORE,
            "python": platform.python_version(), "loadavg_start": os.getloadavg()[0],
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **source_state()}


def source_state() -> dict[str, Any]:
    """Which code was measured: the commit, and product files changed since (read-only git)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10,
                                  env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted_product_files": git("diff", "--name-only", "HEAD", "--", "operator").split()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~1 minute smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, certificates)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    info = machine()
    pin(CLIENT_CORE)   # the orchestrator stays off the server's core too
    started = time.monotonic()
    if len(info["cores"]) < 2:
        print("warning: fewer than 2 cores: server and load generator share one; figures are not comparable")
    if info["loadavg_start"] > 0.5:
        print(f"warning: load average {info['loadavg_start']:.2f} before starting: other processes may disturb the"
              " figures (runs where they took the server's core are flagged DISTURBED)")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="ap-bench-"))
    ok = False
    try:
        ok, result = run_all(plan, workdir, info, started)
    finally:
        if args.keep or not ok:
            print(f"work directory (logs: {workdir / 'children.log'}): {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, separators=(",", ":")))


def run_all(plan: Plan, workdir: pathlib.Path, info: dict[str, Any], started: float) -> tuple[bool, dict[str, Any]]:
    from admission_policy.operator.certificates import generate_bundle, write_files

    write_files(generate_bundle(["localhost", "127.0.0.1"], datetime.datetime.now(datetime.UTC)),
                workdir / "baseline-certs")
    with (workdir / "children.log").open("w") as log, contextlib.ExitStack() as stack:
        servers = {scenario.name: start_server(scenario, plan, workdir, log, stack) for scenario in SCENARIOS}
        closed = measure(servers, plan)
        saturation = report.aggregate(closed["kopf-noop"][PSS_REQUEST])["rps"]
        open_loop = measure_open_loop(servers, plan, saturation)
        for server in servers.values():
            server.info["peak_rss_mb"] = round(peak_rss_mb(server.child.pid) or 0.0, 1)
    print("\n== engine alone (no HTTP), microseconds per request", flush=True)
    engine = run_to_end("engine", "engine_micro.py", ["--seconds", str(plan.micro_seconds),
                                                       "--generated", str(plan.generated)], timeout=300)
    report.print_engine(engine)

    scenarios = {name: {**server.info, "runs": {request: report.aggregate(results)
                                                 for request, results in closed[name].items()}}
                 for name, server in servers.items()}
    for name, runs in open_loop.items():
        scenarios[name]["runs"].update(runs)
    table = report.ratios(closed)
    met = report.targets(scenarios, table, closed)
    report.print_summary(scenarios, table, met, plan.generated if plan.quick else None)
    info["loadavg_end"] = os.getloadavg()[0]
    checks = report.all_as_expected(scenarios)
    disturbed = report.disturbed(scenarios)
    result = {"quick": plan.quick, "plan": dataclasses.asdict(plan), "machine": info, "scenarios": scenarios,
              "ratios": table, "engine": engine, "answers_as_expected": checks, "disturbed_runs": disturbed,
              "elapsed_s": round(time.monotonic() - started, 1), "targets": met}
    print(f"\n   answers as expected: {checks}; disturbed runs: {', '.join(disturbed) or 'none'};"
          f" elapsed {result['elapsed_s']} s", flush=True)
    return checks, result


if __name__ == "__main__":
    main()
