"""Benchmark: the background audit of 10,000 objects on a real API server (issue 14).

Not a test: prints figures, asserts nothing about time. What it does:

1. starts an envtest control plane (``$KUBEBUILDER_ASSETS``, as the e2e tests do) and creates
   ``--objects`` ConfigMaps through the API server, spread over ``--namespaces`` namespaces, every
   other one without the label the audited policy requires;
2. starts the operator (``kopf run``, the e2e harness's ``OperatorProcess``) with the audit on a
   long interval, so that only the scans this script causes run, and a policy on Secrets that the
   admission latency is measured against (its own scan has next to nothing to list);
3. measures admission latency (dry-run Secret creates, one client, sequential) with no scan
   running: the baseline;
4. applies an ``Audit`` policy on ConfigMaps, and while its first scan runs, measures the same
   admission latency again and samples the operator's RSS every 20 ms; the scan ends when its
   ``status.audit`` appears;
5. prints the scan's time (wall clock, and ``status.audit.scanSeconds``), objects scanned,
   violations, reports written, the RSS before and at the peak during the scan, and the admission
   latency percentiles without and during the scan.

    KUBEBUILDER_ASSETS=/path/to/envtest python bench/audit_scan.py [--objects 10000]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests"), str(ROOT / "operator")]

import pykube  # noqa: E402
import yaml  # noqa: E402
from e2e_kube import AdmissionPolicy, Cluster, E2ESettings, OperatorProcess, policy_body  # noqa: E402
from envtest import ControlPlane  # noqa: E402
from pykube.objects import NamespacedAPIObject  # noqa: E402

from admission_policy import reports  # noqa: E402

REPORT_CRDS = ROOT / "charts" / "admission-policy-operator" / "files" / "openreports-crds.yaml"
LABEL = "bench-audit"


class Report(NamespacedAPIObject):  # type: ignore[misc]
    version = reports.API_VERSION
    endpoint = reports.REPORTS
    kind = reports.REPORT


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def create_objects(cluster: Cluster, namespaces: list[str], count: int, workers: int = 8) -> float:
    """``count`` ConfigMaps through the API server; half lack the ``team`` label. Seconds taken."""
    def create(index: int) -> None:
        labels = {LABEL: "yes", **({"team": "a"} if index % 2 else {})}
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": f"cm-{index:05d}", "namespace": namespaces[index % len(namespaces)], "labels": labels},
            "data": {"key": "value" * 20}}
        answer = cluster.create(pykube.ConfigMap, body)
        if not answer.ok:
            raise RuntimeError(f"creating ConfigMap {index}: {answer}")

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, range(count)))
    return time.monotonic() - started


def admission_latencies(cluster: Cluster, namespace: str, until: threading.Event | None, count: int) -> list[float]:
    """Dry-run Secret creates judged by the latency policy, one after the other: seconds each.
    With ``until``, as many as fit before it is set (at least one); else ``count``."""
    seconds: list[float] = []
    index = 0
    while (until is None and index < count) or (until is not None and (not until.is_set() or not seconds)):
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"latency-{index}", "namespace": namespace},
                "stringData": {"k": "v"}}
        started = time.perf_counter()
        answer = cluster.create(pykube.Secret, body, dry_run=True)
        seconds.append(time.perf_counter() - started)
        if not answer.ok:
            raise RuntimeError(f"the latency probe was refused: {answer}")
        index += 1
    return seconds


def wait_for(what: str, check: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def audit_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.get(AdmissionPolicy, name).obj.get("status") or {}).get("audit") or {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--probes", type=int, default=300, help="admission requests of the baseline")
    parser.add_argument("--page-size", type=int, default=500)
    args = parser.parse_args()
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        sys.exit("KUBEBUILDER_ASSETS must name the envtest binaries (see tests/e2e/README.md)")

    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-audit-"))
    (work / "plane").mkdir()
    plane = ControlPlane(pathlib.Path(assets), workdir=work / "plane")
    plane.start()
    operator: OperatorProcess | None = None
    try:
        settings = E2ESettings.from_env(plane.kubeconfig, kubectl=str(plane.kubectl))
        cluster = Cluster(settings)
        cluster.apply_crd()
        for crd in yaml.safe_load_all(REPORT_CRDS.read_text()):
            cluster.create(pykube.CustomResourceDefinition, crd)
        cluster.create_namespace(settings.operator_namespace)
        namespaces = [f"bench-audit-{i}" for i in range(args.namespaces)]
        for name in [*namespaces, "bench-latency"]:
            cluster.create_namespace(name)
        created = create_objects(cluster, namespaces, args.objects)
        print(f"created {args.objects:,} ConfigMaps in {len(namespaces)} namespaces through the API server "
              f"in {created:.1f} s", flush=True)

        (work / "certs").mkdir()
        operator = OperatorProcess(cluster, work / "operator.log", work / "certs", env={
            "AP_AUDIT_INTERVAL": "1h", "AP_AUDIT_PAGE_SIZE": str(args.page_size), "AP_LOG_LEVEL": "WARNING"})
        operator.start()
        assert operator.process is not None
        pid = operator.process.pid

        latency_policy = "bench-latency-secrets"
        cluster.create(AdmissionPolicy, policy_body(latency_policy, enforcement="Enforce", match={"resources": [
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets"], "operations": ["CREATE"]}]},
            validations=[{"expression": "object.metadata.name.startsWith('latency-')", "message": "probe"}]))
        wait_for("the latency policy's first scan", lambda: audit_of(cluster, latency_policy), 120)
        admission_latencies(cluster, "bench-latency", None, 30)   # warm-up
        baseline = admission_latencies(cluster, "bench-latency", None, args.probes)
        rss_before, _ = rss_kib(pid)

        audited = "bench-audit-team-label"
        done = threading.Event()
        samples: list[int] = []

        def sample() -> None:
            while not done.is_set():
                samples.append(rss_kib(pid)[0])
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        during: list[float] = []
        prober = threading.Thread(target=lambda: during.extend(
            admission_latencies(cluster, "bench-latency", done, 0)), daemon=True)
        started = time.monotonic()
        cluster.create(AdmissionPolicy, policy_body(audited, enforcement="Audit", match={
            "resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                           "operations": ["CREATE", "UPDATE"]}], "objectSelector": {"matchLabels": {LABEL: "yes"}}},
            validations=[{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                          "message": "a team label is required"}]))
        prober.start()
        status = wait_for("the audit policy's first scan", lambda: audit_of(cluster, audited), 600)
        wall = time.monotonic() - started
        done.set()
        sampler.join()
        prober.join()
        report = wait_for("the Report of bench-audit-0", lambda: (lambda a: a.obj if a.ok else None)(
            cluster.get(Report, reports.NAME, "bench-audit-0")), 60)
        _, peak_hwm = rss_kib(pid)

        figures = {
            "objects": args.objects,
            "objects_scanned": status["objectsScanned"],
            "violations": status["violations"],
            "scan_seconds": status["scanSeconds"],
            "scan_wall_seconds": round(wall, 2),
            "objects_per_second": round(status["objectsScanned"] / max(status["scanSeconds"], 1e-9)),
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_peak_during_scan_mib": round(max(samples, default=rss_before) / 1024, 1),
            "rss_high_water_mark_mib": round(peak_hwm / 1024, 1),
            "latency_without_scan_ms": {q: round(percentile(baseline, p) * 1000, 2)
                                        for q, p in (("p50", .5), ("p95", .95), ("p99", .99))},
            "latency_during_scan_ms": {q: round(percentile(during, p) * 1000, 2)
                                       for q, p in (("p50", .5), ("p95", .95), ("p99", .99))},
            "requests_during_scan": len(during),
            "report_bench_audit_0_summary": report["summary"],
        }
        print(f"scan: {status['objectsScanned']:,} objects in {status['scanSeconds']:.2f} s "
              f"({figures['objects_per_second']:,}/s; {wall:.2f} s from the policy's creation to its status), "
              f"{status['violations']:,} violations")
        print(f"operator RSS: {figures['rss_before_mib']} MiB before, {figures['rss_peak_during_scan_mib']} MiB at "
              f"the peak during the scan (high-water mark {figures['rss_high_water_mark_mib']} MiB)")
        print(f"admission latency without the scan: p50 {figures['latency_without_scan_ms']['p50']} ms, p99 "
              f"{figures['latency_without_scan_ms']['p99']} ms ({len(baseline)} requests); during it: p50 "
              f"{figures['latency_during_scan_ms']['p50']} ms, p99 {figures['latency_during_scan_ms']['p99']} ms "
              f"({len(during)} requests); p50 ratio "
              f"{statistics.median(during) / statistics.median(baseline):.2f}")
        print(json.dumps(figures))
    finally:
        if operator is not None:
            operator.stop()
        plane.stop()


if __name__ == "__main__":
    main()
