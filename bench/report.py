"""Figures → medians, ratios, targets, and the lines people read."""
from __future__ import annotations

import statistics
import urllib.request
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

PSS_REQUEST: Final = "pss-pod-create"
DISTURBED: Final = 0.05   # a run where other processes took more of the server's core than this is flagged

Runs = dict[str, dict[str, list[dict[str, Any]]]]   # scenario → request → one result per round


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One request kind on one server over the rounds: medians, plus each round's throughput."""
    def median(key: str) -> float:
        return round(statistics.median(float(r[key]) for r in results), 3)
    return {
        "request": results[0]["request"], "rounds": len(results),
        "rps": median("rps"), "p50_ms": median("p50_ms"), "p95_ms": median("p95_ms"), "p99_ms": median("p99_ms"),
        "max_ms": max(r["max_ms"] for r in results),
        "requests": sum(r["requests"] for r in results), "errors": sum(r["errors"] for r in results),
        "server_cpu": median("server_cpu"), "client_cpu": median("client_cpu"),
        "others_on_server_core": max(r["others_on_server_core"] or 0.0 for r in results),
        "as_expected": all(r["as_expected"] for r in results),
        "rps_by_round": [r["rps"] for r in results],
    }


def round_ratio(runs: Runs, scenario: str, baseline: str, request: str, baseline_request: str | None = None) -> \
        float | None:
    """Median over rounds of (this round's throughput / the baseline's in the same round)."""
    mine = runs.get(scenario, {}).get(request)
    theirs = runs.get(baseline, {}).get(baseline_request or request)
    if not mine or not theirs:
        return None
    pairs = [a["rps"] / b["rps"] for a, b in zip(mine, theirs, strict=False) if b["rps"]]
    return round(statistics.median(pairs), 3) if pairs else None


def ratios(runs: Runs) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each result over the same request's on (b) Kopf no-op and on (a) bare aiohttp."""
    return {name: {request: {"vs_kopf_noop": round_ratio(runs, name, "kopf-noop", request),
                             "vs_bare": round_ratio(runs, name, "bare", request)}
                   for request in per_request}
            for name, per_request in runs.items()}


def targets(scenarios: dict[str, Any], table: dict[str, Any], runs: Runs) -> dict[str, dict[str, Any]]:
    """Issue 13's targets, each with its measured value and limit (a missing figure is not met)."""
    pss_open, noop_open = scenarios["pss"]["runs"]["open-loop"], scenarios["kopf-noop"]["runs"]["open-loop"]
    clean = all(r["errors"] == 0 and r["dropped"] == 0 for r in (pss_open, noop_open))
    p99_ratio = pss_open["p99_ms"] / noop_open["p99_ms"] if noop_open["p99_ms"] and clean else None
    peak = scenarios["pss+generated"]["peak_rss_mb"]

    def at_least(value: float | None, limit: float) -> dict[str, Any]:
        return {"value": value, "limit": limit, "met": value is not None and value >= limit}

    def at_most(value: float | None, limit: float) -> dict[str, Any]:
        return {"value": None if value is None else round(value, 3), "limit": limit,
                "met": value is not None and value <= limit}
    return {
        "pss_throughput_ge_0.9x_kopf_noop": at_least(table["pss"][PSS_REQUEST]["vs_kopf_noop"], 0.9),
        "mutation_throughput_ge_0.75x_kopf_noop": at_least(
            table["mutation"]["sidecar-pod-create"]["vs_kopf_noop"], 0.75),
        "generated_1000_throughput_ge_0.95x_pss": at_least(round_ratio(runs, "pss+generated", "pss", PSS_REQUEST),
                                                            0.95),
        "tenants_1000_throughput_ge_0.95x_pss": at_least(round_ratio(runs, "pss+tenants", "pss", PSS_REQUEST), 0.95),
        "pss_p99_le_1.5x_kopf_noop_at_half_its_saturation": at_most(p99_ratio, 1.5),
        "generated_1000_peak_rss_le_120mb": at_most(peak if peak > 0 else None, 120.0),
    }


LAG: Final = "admission_policy_event_loop_lag_seconds"


def loop_lag(metrics_port: int) -> dict[str, float]:
    """The operator's event-loop lag histogram as scraped: cumulative count per bucket bound."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {sample.labels["le"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == LAG for sample in family.samples if sample.name == f"{LAG}_bucket"}


def lag_between(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the loop-lag samples taken during a run say: how many, how many late by more than 10,
    50 and 100 ms, and the bucket of the latest ("<= 0.25 s")."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in after}
    samples = counts.get("+Inf", 0.0)
    worst = next((bound for bound, count in sorted(counts.items(), key=lambda item: _bound(item[0]))
                  if count == samples), "+Inf")
    return {"samples": int(samples), **{f"over_{ms}ms": int(samples - counts.get(str(ms / 1000), samples))
                                        for ms in (10, 50, 100)}, "worst_le_s": worst}


def _bound(text: str) -> float:
    return float("inf") if text == "+Inf" else float(text)


def all_as_expected(scenarios: dict[str, Any]) -> bool:
    return all(all(s["checks"].values()) and all(r.get("as_expected", True) for r in s["runs"].values())
               for s in scenarios.values())


def disturbed(scenarios: dict[str, Any]) -> list[str]:
    return [f"{name}/{request}" for name, scenario in scenarios.items()
            for request, result in scenario["runs"].items()
            if (result.get("others_on_server_core") or 0) > DISTURBED]


# --- printing ----------------------------------------------------------------------------------

def print_run(name: str, result: dict[str, Any]) -> None:
    extra = f" (offered {result['offered_rps']:.0f}/s, dropped {result['dropped']})" if "offered_rps" in result else ""
    if "loop_lag" in result:
        lag = result["loop_lag"]
        extra += (f"; event loop late >10 ms in {lag['over_10ms']}, >50 ms in {lag['over_50ms']}, >100 ms in"
                  f" {lag['over_100ms']} of {lag['samples']} samples, worst <= {lag['worst_le_s']} s")
    flag = "" if result.get("as_expected", True) else "  UNEXPECTED ANSWERS"
    if (result.get("others_on_server_core") or 0) > DISTURBED:
        flag += f"  DISTURBED ({result['others_on_server_core']:.0%} of the server core went to other processes)"
    print(f"   {name:<34} {result['rps']:>8.1f} req/s  p50 {result['p50_ms']:>7.2f}  p95 {result['p95_ms']:>7.2f}"
          f"  p99 {result['p99_ms']:>7.2f} ms  errors {result['errors']}  cpu server {result['server_cpu']}"
          f" client {result['client_cpu']}{extra}{flag}", flush=True)


def print_summary(scenarios: dict[str, Any], table: dict[str, Any], met: dict[str, dict[str, Any]],
                  quick_generated: int | None) -> None:
    print("\n== medians over the rounds; throughput as a ratio to (b) Kopf no-op and (a) bare, same request")
    for name, scenario in scenarios.items():
        for request, result in scenario["runs"].items():
            if request.startswith("open-loop"):
                continue
            ratio = table[name][request]
            print(f"   {name:<14} {request:<20} {result['rps']:>8.1f} req/s  p50 {result['p50_ms']:>6.2f}"
                  f"  p99 {result['p99_ms']:>6.2f} ms   x(b) {_fmt(ratio['vs_kopf_noop'])}"
                  f"  x(a) {_fmt(ratio['vs_bare'])}")
    print("   peak RSS (MB): " + ", ".join(f"{name} {s['peak_rss_mb']}" for name, s in scenarios.items()))
    note = f" (quick run: {quick_generated} generated policies stand in for 1,000)" if quick_generated else ""
    print(f"\n== targets{note}")
    for name, target in met.items():
        value = "n/a" if target["value"] is None else f"{target['value']:g}"
        print(f"   {'MET   ' if target['met'] else 'MISSED'} {name}: {value} (limit {target['limit']:g})")


def print_engine(engine: dict[str, Any]) -> None:
    for name in ("pss", "pss_deployment", "pss_denied", "mutation"):
        part = engine[name]
        print(f"   {name:<14} evaluate {part['evaluate_us']:>7.1f} = activations {part['activation_build_us']:>6.1f}"
              f" ({part['activations']}) + CEL {part['cel_evaluation_us']:>7.1f} ({part['cel_programs']} programs)"
              f" + patch {part['patch_computation_us']:>6.1f} + other {part['engine_other_us']:>6.1f};"
              f" json {part['json_decode_us']:.1f}, parse {part['parse_review_us']:.1f},"
              f" response {part['build_response_us']:.1f}", flush=True)
    pod, deployment = engine["pss"]["evaluate_us"], engine["pss_deployment"]["evaluate_us"]
    print(f"   Pod Security on a Deployment's Pod template (issue 17): {deployment:.1f} us per CREATE, "
          f"next to {pod:.1f} us for the Pod itself ({deployment / pod:.2f}x)", flush=True)
    plugin = engine["plugin"]
    with_plugin, cel_only, cel_rule = plugin["image_plugin_us"], plugin["cel_only_us"], plugin["cel_image_rule_us"]
    print(f"   PSS Pod with the image-references plugin (issue 16): {with_plugin:.1f} us, next to {cel_only:.1f} us"
          f" for the CEL-only PSS set ({with_plugin / cel_only:.2f}x) and {cel_rule:.1f} us with a CEL prefix check"
          f" on images instead ({with_plugin / cel_rule:.2f}x); plugin call {plugin['plugin_call_us']:.1f} us",
          flush=True)
    for context in engine["context"]:
        cost, objects = context["evaluate_us"], context["objects"]
        print(f"   a policy reading a context of {objects:,} Deployments (issue 15): {cost:.1f} us per CREATE"
              f" ({cost / objects:.1f} us per object), next to {pod:.1f} us for the PSS Pod CREATE ({cost / pod:.1f}x)",
              flush=True)
    scale = engine["scale"]
    print(f"   {scale['generated']} generated policies: compile {scale['compile_ms_per_policy']} ms each,"
          f" {scale['rss_mb_per_100_policies']} MB per 100; candidates() {scale['candidates_us_pss_only']} ->"
          f" {scale['candidates_us_with_generated']} us; evaluate {scale['evaluate_us_pss_only']} ->"
          f" {scale['evaluate_us_with_generated']} us", flush=True)
    print("   RSS of the imports alone (MB): " + ", ".join(f"{k} {v}" for k, v in engine["import_rss_mb"].items()),
          flush=True)


def _fmt(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}"
