"""The engine alone on one very wide Pod: time and memory as the object grows.

    python bench/large_object.py [--containers 1,100,1000,2000,5000] [--expression EXPR]

Each size runs in a fresh interpreter (peak RSS is per process and never goes down), which
compiles the Pod Security examples (baseline + restricted), evaluates a one-container Pod (so
programs are built), then one Pod CREATE whose Pod has N containers ``{"name": "cN", "image":
"i"}`` (what issue 18 sent): the wall time of that ``evaluate()`` (``seconds``: with the cost
estimates for a request of that size, computed once per policy and size), of the same again
(``again``), and how much the process's peak RSS grew. With ``--expression`` the engine evaluates
that one validation instead of the PSS set.

Cost and memory must grow linearly with N: µs/container divides ``again`` by N.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

import policies
import reviews
from admission_policy import api
from admission_policy.engine import PolicySet, compile_policy, evaluate, parse_review


def one_expression_policy(expression: str) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "one"},
            "spec": {"match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                              "operations": ["CREATE"]}]},
                     "validations": [{"expression": expression}]}}


def measure(containers: int, expression: str | None) -> dict[str, Any]:
    """In this process: compile, then time one evaluate() and the peak-RSS growth it caused."""
    bodies = [one_expression_policy(expression)] if expression else policies.example_set("pss")
    policy_set = PolicySet(compile_policy(api.parse_policy(body)) for body in bodies)
    evaluate(policy_set, parse_review(reviews.wide_pod_create(1)))   # warm: programs built, first estimates
    request = parse_review(reviews.wide_pod_create(containers))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    decision = evaluate(policy_set, request)
    seconds = time.perf_counter() - started
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    started = time.perf_counter()
    evaluate(policy_set, request)   # again: the cost estimates for this size are cached now
    again = time.perf_counter() - started
    return {"containers": containers, "seconds": round(seconds, 4), "again": round(again, 4),
            "peak_rss_growth_mb": round(grown, 1),
            "allowed": decision.allowed, "message_chars": len(decision.message),
            "first_line": decision.message.splitlines()[0][:120] if decision.message else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containers", default="1,100,1000,2000,5000")
    parser.add_argument("--expression", help="one validation to evaluate instead of the PSS examples")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)   # the child: one size, JSON out
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.expression)))
        return
    print(f"{'containers':>10} {'seconds':>9} {'again':>9} {'peak RSS +MB':>13} {'µs/container':>13}  decision")
    for containers in (int(n) for n in args.containers.split(",")):
        command = [sys.executable, __file__, "--one", str(containers)]
        if args.expression:
            command += ["--expression", args.expression]
        row = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        verdict = "allowed" if row["allowed"] else f"denied ({row['message_chars']} chars): {row['first_line']}"
        print(f"{containers:>10} {row['seconds']:>9.4f} {row['again']:>9.4f} {row['peak_rss_growth_mb']:>13.1f} "
              f"{row['again'] / containers * 1e6:>13.1f}  {verdict}")


if __name__ == "__main__":
    main()
