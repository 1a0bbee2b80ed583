"""Issue 18's stress case: one 5,000-container Pod, sent to the real webhook server while normal
requests flow. Figures and a verdict per target; never a failed build.

    python bench/stress.py [--rate 200] [--seconds 12] [--wide 5] [--containers 5000] [--keep]

Starts the operator as ``bench/run.py`` does (``servers.py operator``: the production entry point,
an emulated cluster, the Pod Security examples loaded and Active), waits until it is idle, then:

- the load generator (``loadgen.py``, its own process and core) sends ``pss-pod-create`` on an
  open loop at ``--rate`` requests/s: the normal requests, whose latency counts from when each
  was due (a stalled server shows as latency);
- meanwhile, from this process, ``--wide`` times one after the other (one second apart), the
  Pod CREATE of ``reviews.wide_pod_create`` (``--containers`` containers), each answer checked;
- a sampler reads the operator's VmRSS every 20 ms.

Targets: the operator's RSS grows by less than 50 MB over its idle RSS, and no normal request
takes longer than the webhook timeout (5 s) or fails. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import pathlib
import shutil
import ssl
import sys
import tempfile
import threading
import time
from typing import Any

import reviews
from common import CLIENT_CORE, peak_rss_mb, pin, rss_mb
from procs import ChildError, post, run_to_end
from run import FULL, PSS_REQUEST, Scenario, start_server

RSS_GROWTH_TARGET_MB = 50.0
WEBHOOK_TIMEOUT_S = 5.0


class RssSampler(threading.Thread):
    """The highest VmRSS of a process, sampled until stopped (VmHWM would include start-up)."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.highest = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.highest = max(self.highest, rss_mb(self.pid) or 0.0)
            self.done.wait(self.every)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.highest


def send_wide(port: int, cafile: str, containers: int, count: int, gap: float, started: threading.Event,
              results: list[dict[str, Any]]) -> None:
    """``count`` wide Pod CREATEs, one after another, ``gap`` seconds apart (after ``started``)."""
    started.wait()
    for index in range(count):
        body = reviews.encode(reviews.wide_pod_create(containers, uid=f"wide-{index}"))
        begin = time.perf_counter()
        try:
            status, answer = post(port, "/validate", body, cafile, timeout=30.0)
        except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
            results.append({"error": repr(exc), "seconds": round(time.perf_counter() - begin, 3)})
        else:
            response = answer.get("response", {}) if isinstance(answer, dict) else {}
            message = (response.get("status") or {}).get("message", "")
            results.append({"status": status, "seconds": round(time.perf_counter() - begin, 3),
                            "allowed": response.get("allowed"), "message": message.splitlines()[0][:160] if message
                            else ""})
        time.sleep(gap)


def stress(args: argparse.Namespace, workdir: pathlib.Path) -> dict[str, Any]:
    scenario = Scenario("pss", "operator", (PSS_REQUEST,), "pss")
    with (workdir / "children.log").open("w") as log, contextlib.ExitStack() as stack:
        server = start_server(scenario, FULL, workdir, log, stack)
        pid = server.child.pid
        idle_rss = rss_mb(pid) or 0.0
        sampler = RssSampler(pid)
        sampler.start()
        wide: list[dict[str, Any]] = []
        go = threading.Event()
        sender = threading.Thread(target=send_wide, args=(server.port, server.cafile, args.containers, args.wide,
                                                          1.0, go, wide), daemon=True)
        sender.start()
        warmup = 1.0
        timer = threading.Timer(warmup + 1.0, go.set)   # once the measured window has begun
        timer.start()
        print(f"== {args.rate:.0f} {PSS_REQUEST}/s for {args.seconds:.0f} s; {args.wide} times a "
              f"{args.containers}-container Pod meanwhile", flush=True)
        normal = run_to_end("loadgen", "loadgen.py", [
            "--url", f"https://127.0.0.1:{server.port}", "--ca", server.cafile, "--request", PSS_REQUEST,
            "--server-pid", str(pid), "--mode", "open", "--rate", str(args.rate), "--warmup", str(warmup),
            "--duration", str(args.seconds), "--connections", "16"], timeout=args.seconds + 120)
        go.set()
        sender.join(timeout=120)
        timer.cancel()
        highest = sampler.stop()
        after_rss = rss_mb(pid) or 0.0
        hwm = peak_rss_mb(pid) or 0.0
    normal.pop("sample_response", None)
    growth = highest - idle_rss
    targets = {
        "rss_growth_lt_50mb": growth < RSS_GROWTH_TARGET_MB,
        "no_normal_request_slower_than_timeout": normal["max_ms"] < WEBHOOK_TIMEOUT_S * 1000
                                                  and normal["errors"] == 0 and normal["dropped"] == 0,
        "wide_pods_answered": len(wide) == args.wide and all(w.get("status") == 200 for w in wide),
    }
    return {"containers": args.containers, "wide_requests": wide, "normal": normal,
            "rss_idle_mb": round(idle_rss, 1), "rss_highest_mb": round(highest, 1),
            "rss_growth_mb": round(growth, 1), "rss_after_mb": round(after_rss, 1), "vm_hwm_mb": round(hwm, 1),
            "targets": targets}


def print_report(result: dict[str, Any]) -> None:
    for index, wide in enumerate(result["wide_requests"]):
        verdict = wide.get("error") or (f"HTTP {wide['status']}, allowed={wide['allowed']}: {wide['message']}")
        print(f"   wide Pod #{index + 1}: {wide['seconds']:.3f} s, {verdict}")
    normal = result["normal"]
    print(f"   normal requests: {normal['requests']} at {normal['rps']} req/s, p50 {normal['p50_ms']} ms, "
          f"p99 {normal['p99_ms']} ms, max {normal['max_ms']} ms, errors {normal['errors']}, "
          f"dropped {normal['dropped']}, server CPU {normal['server_cpu']}")
    print(f"   operator RSS: idle {result['rss_idle_mb']} MB, highest during the run {result['rss_highest_mb']} MB "
          f"(+{result['rss_growth_mb']} MB), after {result['rss_after_mb']} MB; VmHWM {result['vm_hwm_mb']} MB")
    for name, met in result["targets"].items():
        print(f"   {'PASS' if met else 'MISS'}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="normal requests per second (open loop)")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long the normal requests flow")
    parser.add_argument("--wide", type=int, default=5, help="how many wide Pods to send, one a second")
    parser.add_argument("--containers", type=int, default=5_000)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, certificates)")
    args = parser.parse_args()
    pin(CLIENT_CORE)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="ap-stress-"))
    from admission_policy.operator.certificates import generate_bundle, write_files
    write_files(generate_bundle(["localhost", "127.0.0.1"], datetime.datetime.now(datetime.UTC)),
                workdir / "baseline-certs")
    result: dict[str, Any] = {}
    try:
        result = stress(args, workdir)
        print_report(result)
    except ChildError as exc:
        result = {"error": str(exc)}
        print(f"error: {exc}", file=sys.stderr)
    finally:
        if args.keep or "error" in result:
            print(f"work directory (logs: {workdir / 'children.log'}): {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
