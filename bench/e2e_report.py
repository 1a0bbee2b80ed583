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
NATIVE, SAME_CEL, VAP = "native", "native-same-cel", "vap"
# The scenarios of generated objects, each compared with the hand-written VAP: the Pod Security
# examples, and pss-vap.yaml's own checks written as an AdmissionPolicy (the same CEL).
NATIVES = (NATIVE, SAME_CEL)
NATIVE_LIMIT = 1.1   # the issue: native enforcement within 10% of hand-written VAPs


def idle_rates(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU seconds per second each process uses with no load (sampled over ``seconds``)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    elapsed = time.monotonic() - started
    return {name: round((after[name] or 0.0) - (before[name] or 0.0), 3) / elapsed for name in pids
            if before[name] is not None and after[name] is not None}


VAP_PLUGIN = 'apiserver_admission_controller_admission_duration_seconds_{}{{name="ValidatingAdmissionPolicy",'


def vap_plugin_totals(metrics: str) -> dict[str, float]:
    """Seconds and calls of the API server's ValidatingAdmissionPolicy admission plugin (validate step,
    every operation, admitted or rejected) from its /metrics text."""
    totals = {"seconds": 0.0, "calls": 0.0}
    for line in metrics.splitlines():
        for key, suffix in (("seconds", "sum"), ("calls", "count")):
            if line.startswith(VAP_PLUGIN.format(suffix)) and 'type="validate"' in line:
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def plugin_us(result: Level) -> float | None:
    """Mean microseconds per call of the ValidatingAdmissionPolicy plugin over ``result``'s run."""
    plugin = result.get("vap_plugin") or {}
    return float(plugin["seconds"] / plugin["calls"] * 1e6) if plugin.get("calls") else None


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
        "vap_plugin": {key: round(sum((r.get("vap_plugin") or {}).get(key, 0.0) for r in results), 6)
                       for key in ("seconds", "calls")},
        "by_kind": {kind: sum(r["by_kind"].get(kind, 0) for r in results) for kind in results[0]["by_kind"]},
        "client_cpu": round(statistics.median(r["client_cpu"] or 0.0 for r in results), 3),
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


def added(result: Level, base: Level) -> tuple[float, float | None]:
    """What ``result`` adds over ``base`` (the baseline at the same level): average latency (ms) and
    CPU per request (API server + operator, less the baseline's API server; ms)."""
    api, api_base = cpu_ms(result, "kube-apiserver"), cpu_ms(base, "kube-apiserver")
    cpu = None if api is None or api_base is None else api + (cpu_ms(result, "operator") or 0.0) - api_base
    return float(result["avg_ms"] - base["avg_ms"]), cpu


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return None if mine is None or theirs is None or theirs <= 0 else round(mine / theirs, 3)


def versus(scenarios: dict[str, Scenario], rounds: dict[str, dict[int, list[Level]]], name: str, other: str,
           level: int) -> dict[str, Any]:
    """``name``'s additions over ``other``'s at ``level``: from all rounds together, and round by round
    (each against the baseline of its own round), so the run-to-run noise shows beside the ratio."""
    base = scenarios[BASELINE][level]
    (lat, cpu), (lat_o, cpu_o) = added(scenarios[name][level], base), added(scenarios[other][level], base)
    per_round: dict[str, list[float | None]] = {"latency": [], "cpu": [], "plugin": []}
    for mine, theirs, baseline in zip(rounds[name][level], rounds[other][level], rounds[BASELINE][level],
                                      strict=False):
        (a, b), (c, d) = added(mine, baseline), added(theirs, baseline)
        per_round["latency"].append(_ratio(a, c))
        per_round["cpu"].append(_ratio(b, d))
        per_round["plugin"].append(_ratio(plugin_us(mine), plugin_us(theirs)))
    return {"added_latency_ms": [round(lat, 3), round(lat_o, 3)],
            "vap_plugin_us": [_round(plugin_us(scenarios[name][level])), _round(plugin_us(scenarios[other][level]))],
            "added_cpu_ms": [None if cpu is None else round(cpu, 3), None if cpu_o is None else round(cpu_o, 3)],
            "latency_ratio": _ratio(lat, lat_o), "cpu_ratio": _ratio(cpu, cpu_o),
            "latency_ratio_by_round": per_round["latency"], "cpu_ratio_by_round": per_round["cpu"],
            "vap_plugin_ratio_by_round": per_round["plugin"]}


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
    met = {
        f"webhook_added_cpu_le_0.4x_vap_at_c{top}": verdict(cpu_vs_vap, 0.4),
        f"operator_cpu_le_0.5x_apiserver_at_c{top}": verdict(operator_vs_api, 0.5),
        f"added_avg_latency_le_46pct_at_c{first}": verdict(added, 0.46),
    }
    for name in NATIVES:
        if name not in scenarios or VAP not in scenarios:
            continue
        at_first, at_top = native_ratios(scenarios, name, first), native_ratios(scenarios, name, top)
        key = name.replace("-", "_")
        met[f"{key}_added_latency_le_{NATIVE_LIMIT}x_vap_at_c{first}"] = verdict(at_first[0], NATIVE_LIMIT)
        met[f"{key}_added_cpu_le_{NATIVE_LIMIT}x_vap_at_c{first}"] = verdict(at_first[1], NATIVE_LIMIT)
        met[f"{key}_added_cpu_le_{NATIVE_LIMIT}x_vap_at_c{top}"] = verdict(at_top[1], NATIVE_LIMIT)
    return met


def native_ratios(scenarios: dict[str, Scenario], name: str, level: int) -> tuple[float | None, float | None]:
    """(added latency, added CPU per request) of ``name`` over ``vap``'s, all rounds together."""
    base = scenarios[BASELINE][level]
    (lat, cpu), (lat_v, cpu_v) = added(scenarios[name][level], base), added(scenarios[VAP][level], base)
    return _ratio(lat, lat_v), _ratio(cpu, cpu_v)


def versus_key(name: str) -> str:
    """Where ``info`` keeps a generated scenario's comparison with ``vap``: ``native_vs_vap``, …"""
    return f"{name.replace('-', '_')}_vs_vap"


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
          + f"  VAP plugin {_us(plugin_us(result))} us/call"
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
    for name in NATIVES:
        comparison = info.get(versus_key(name)) or {}
        if comparison:
            print(f"\n== {name} (generated VAPs) against vap (hand-written): what each adds over none, and the"
                  " ratio; per round in brackets")
        for level, c in comparison.items():
            print(f"   c={level:<3} added latency {c['added_latency_ms'][0]:.2f} vs {c['added_latency_ms'][1]:.2f} ms:"
                  f" x{_ms(c['latency_ratio'])} {_rounds(c['latency_ratio_by_round'])}"
                  f"  added CPU {_ms(c['added_cpu_ms'][0])} vs {_ms(c['added_cpu_ms'][1])} ms/req:"
                  f" x{_ms(c['cpu_ratio'])} {_rounds(c['cpu_ratio_by_round'])}"
                  f"  VAP plugin {c['vap_plugin_us'][0]} vs {c['vap_plugin_us'][1]} us/call"
                  f" {_rounds(c['vap_plugin_ratio_by_round'])}")
    print("\n== targets (end to end)")
    for name, target in met.items():
        value = "n/a" if target["value"] is None else f"{target['value']:.3f}"
        print(f"   {'MET   ' if target['met'] else 'MISSED'} {name}: {value} (limit {target['limit']})")


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _rounds(values: list[float | None]) -> str:
    return "[" + " ".join("n/a" if v is None else f"{v:.2f}" for v in values) + "]"


def _rps_ratio(scenarios: dict[str, Scenario], name: str, level: int) -> float | None:
    base = scenarios[BASELINE][level]["rps"]
    return scenarios[name][level]["rps"] / base if base else None
