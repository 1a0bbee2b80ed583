"""bench/e2e.py's figures → per-request CPU, ratios to the no-webhook baseline, targets, printed lines.

Every figure is a ratio between runs of the same process on the same machine in the same run:
CPU seconds per request (from /proc, divided by the requests answered in the window) and latency
over the "none" scenario's at the same concurrency.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from common import cpu_seconds

Level = dict[str, Any]                 # one apiload.py result
Scenario = dict[int, Level]            # concurrency → result

BASELINE = "none"


def idle_rates(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU seconds per second each process uses with no load (sampled over ``seconds``)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    elapsed = time.monotonic() - started
    return {name: round((after[name] or 0.0) - (before[name] or 0.0), 3) / elapsed for name in pids
            if before[name] is not None and after[name] is not None}


def combine(results: list[Level]) -> Level:
    """One level of one scenario over the rounds: totals for requests and CPU (so per-request CPU
    is total over total), the request-weighted mean latency, medians of the percentiles."""
    requests = sum(r["requests"] for r in results)
    seconds = sum(r["seconds"] for r in results)

    def total(key: str) -> dict[str, float | None]:
        names = results[0][key]
        return {n: None if any(r[key].get(n) is None for r in results) else round(sum(r[key][n] for r in results), 3)
                for n in names}
    return {
        "concurrency": results[0]["concurrency"], "rounds": len(results), "requests": requests,
        "seconds": round(seconds, 3), "rps": round(requests / seconds, 1) if seconds else 0.0,
        "rps_by_round": [r["rps"] for r in results],
        "avg_ms": round(sum(r["avg_ms"] * r["requests"] for r in results) / requests, 3) if requests else 0.0,
        **{key: round(statistics.median(r[key] for r in results), 3) for key in ("p50_ms", "p95_ms", "p99_ms")},
        "max_ms": max(r["max_ms"] for r in results),
        "cpu_seconds": total("cpu_seconds"), "cpu_net": total("cpu_net"),
        "by_kind": {kind: sum(r["by_kind"].get(kind, 0) for r in results) for kind in results[0]["by_kind"]},
        "client_cpu": statistics.median(r["client_cpu"] or 0.0 for r in results),
        "operator_rss_mb": max((r["operator_rss_mb"] for r in results if r.get("operator_rss_mb")), default=None),
        "denied": sum(r["denied"] for r in results), "mismatches": sum(r["mismatches"] for r in results),
        "mismatch_samples": [s for r in results for s in r["mismatch_samples"]][:3],
    }


def cpu_ms(result: Level, prefix: str) -> float | None:
    """CPU milliseconds per request (less the idle rate) of the processes whose name starts with ``prefix``."""
    values = [v for name, v in result["cpu_net"].items() if name.startswith(prefix) and v is not None]
    if not values or not result["requests"]:
        return None
    return sum(values) / result["requests"] * 1000


def operator_ms_per_call(result: Level) -> float | None:
    """Operator CPU per webhook call: the DELETEs of the mix are not routed to it."""
    calls = result["requests"] - result["by_kind"].get("delete", 0)
    values = [v for name, v in result["cpu_net"].items() if name.startswith("operator") and v is not None]
    return sum(values) / calls * 1000 if values and calls else None


def added_cpu_ms(scenarios: dict[str, Scenario], name: str, level: int) -> float | None:
    """API server + operator CPU per request over the baseline's API server CPU per request."""
    mine, base = scenarios[name][level], scenarios[BASELINE][level]
    api, operator, api_base = cpu_ms(mine, "kube-apiserver"), cpu_ms(mine, "operator") or 0.0, \
        cpu_ms(base, "kube-apiserver")
    if api is None or api_base is None:
        return None
    return api + operator - api_base


def latency_ratio(scenarios: dict[str, Scenario], name: str, level: int) -> float | None:
    base = scenarios[BASELINE][level]["avg_ms"]
    return scenarios[name][level]["avg_ms"] / base if base else None


def targets(scenarios: dict[str, Scenario], levels: list[int]) -> dict[str, dict[str, Any]]:
    """Each target: its measured value and whether it is met (a missing figure is not met)."""
    top, first = max(levels), min(levels)
    webhook, vap = added_cpu_ms(scenarios, "pss", top), added_cpu_ms(scenarios, "vap", top)
    cpu_vs_vap = webhook / vap if webhook is not None and vap and vap > 0 else None
    pss = scenarios["pss"][top]
    operator, api = cpu_ms(pss, "operator"), cpu_ms(pss, "kube-apiserver")
    operator_vs_api = operator / api if operator is not None and api else None
    latency = latency_ratio(scenarios, "pss", first)
    added = latency - 1 if latency is not None else None

    def verdict(value: float | None, limit: float) -> dict[str, Any]:
        return {"value": None if value is None else round(value, 3), "limit": limit,
                "met": value is not None and value <= limit}
    return {
        f"webhook_added_cpu_le_0.4x_vap_at_c{top}": verdict(cpu_vs_vap, 0.4),
        f"operator_cpu_le_0.5x_apiserver_at_c{top}": verdict(operator_vs_api, 0.5),
        f"added_avg_latency_le_46pct_at_c{first}": verdict(added, 0.46),
    }


# --- printing ----------------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}"


def print_level(name: str, result: Level, baseline: Level | None, label: str = "") -> None:
    """One run, with its latency over the latest baseline run at the same level."""
    level = result["concurrency"]
    ratio = result["avg_ms"] / baseline["avg_ms"] if baseline and baseline["avg_ms"] and name != BASELINE else None
    vs = "" if ratio is None else f"  avg x{ratio:.2f} ({ratio - 1:+.0%})"
    operator = cpu_ms(result, "operator")
    flag = f"  MISMATCHES {result['mismatches']}: {result['mismatch_samples']}" if result["mismatches"] else ""
    print(f"   {label}c={level:<3} {result['rps']:>7.1f} req/s  avg {result['avg_ms']:>6.2f}"
          f"  p50 {result['p50_ms']:>6.2f}  p95 {result['p95_ms']:>6.2f}  p99 {result['p99_ms']:>7.2f} ms{vs}"
          f"  | CPU ms/req: apiserver {_ms(cpu_ms(result, 'kube-apiserver'))}"
          + ("" if operator is None else f" operator {_ms(operator)}")
          + f" etcd {_ms(cpu_ms(result, 'etcd'))}  client {result['client_cpu']} core"
          + (f"  operator RSS {result['operator_rss_mb']} MB" if result.get("operator_rss_mb") else "")
          + f"  denied {result['denied']}{flag}", flush=True)


def print_summary(scenarios: dict[str, Scenario], levels: list[int], met: dict[str, dict[str, Any]],
                  info: dict[str, Any]) -> None:
    print("\n== all rounds together (CPU: totals over requests; latency over the no-webhook baseline, same level)")
    for name in scenarios:
        for level in levels:
            print_level(name, scenarios[name][level], scenarios[BASELINE][level], label=f"{name:<14} ")
    print("\n== what each adds per request over the no-webhook baseline, same concurrency")
    for name in scenarios:
        if name == BASELINE:
            continue
        for level in levels:
            added, ratio = added_cpu_ms(scenarios, name, level), latency_ratio(scenarios, name, level)
            print(f"   {name:<14} c={level:<3} added CPU {_ms(added)} ms/req (API server + operator)"
                  f"  avg latency x{_ms(ratio)}  throughput x{_ms(_rps_ratio(scenarios, name, level))}")
    for name in scenarios:
        per_call = [operator_ms_per_call(scenarios[name][level]) for level in levels]
        if any(v is not None for v in per_call):
            print(f"   {name:<14} operator CPU per webhook call (ms), by level: "
                  + ", ".join(f"c={level} {_ms(v)}" for level, v in zip(levels, per_call, strict=True)))
    for name, rss in info.get("operator_rss_mb", {}).items():
        print(f"   operator RSS, {name}: {rss}")
    scale = info.get("scale_out")
    if scale:
        print(f"\n== scale-out at c={scale['concurrency']}: two replicas {scale['two']['rps']:.1f} req/s, one"
              f" {scale['one']['rps']:.1f} req/s: x{scale['ratio']:.2f}; connections the proxy gave each of the two:"
              f" {scale['connections_with_two']} (2 cores for everything: see bench/README.md)")
    print("\n== targets (end to end)")
    for name, target in met.items():
        value = "n/a" if target["value"] is None else f"{target['value']:.3f}"
        print(f"   {'MET   ' if target['met'] else 'MISSED'} {name}: {value} (limit {target['limit']})")


def _rps_ratio(scenarios: dict[str, Scenario], name: str, level: int) -> float | None:
    base = scenarios[BASELINE][level]["rps"]
    return scenarios[name][level]["rps"] / base if base else None
