"""The reliability scenarios of issue 12, run longer than CI runs them, with their figures.

    KUBEBUILDER_ASSETS=/path/to/envtest python reliability/run.py                             # 10 times CI
    KUBEBUILDER_ASSETS=... python reliability/run.py --scale 3 -k reload                      # one scenario

CI runs the same tests (tests/e2e/test_reliability_*.py) at scale 1, where they assert zero wrong
decisions, no crash and no lost object. Here ``RELIABILITY_SCALE`` multiplies their request counts,
policy counts and durations, and the figures each scenario reports are collected and printed as
one table at the end (and as JSON lines in ``--report``). The fuzz tests' long profile runs too
(``HYPOTHESIS_PROFILE=long``). Figures, not verdicts: the exit status is pytest's.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCENARIOS = ["tests/e2e/test_reliability_*.py", "tests/operator/test_fuzz_webhook.py", "tests/unit/test_fuzz_policy.py"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=10.0, help="multiplies request and policy counts (CI: 1)")
    parser.add_argument("--report", type=pathlib.Path, help="also keep the figures here (JSON lines)")
    parser.add_argument("-k", dest="keyword", help="only the scenarios whose test names match (pytest -k)")
    args = parser.parse_args()
    if not os.environ.get("KUBEBUILDER_ASSETS") and not os.environ.get("KUBECONFIG"):
        print("reliability/run.py needs an API server: KUBEBUILDER_ASSETS naming the envtest binaries "
              "(see tests/e2e/README.md)", file=sys.stderr)
        return 2
    report = args.report or pathlib.Path(tempfile.mkstemp(prefix="reliability-", suffix=".jsonl")[1])
    report.write_text("")
    env = {**os.environ, "RELIABILITY_SCALE": str(args.scale), "RELIABILITY_REPORT": str(report.resolve()),
           "HYPOTHESIS_PROFILE": "long"}
    files = sorted(str(path.relative_to(ROOT)) for pattern in SCENARIOS for path in ROOT.glob(pattern))
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *files,
               *(["-k", args.keyword] if args.keyword else [])]
    print("$", " ".join(command), f"(RELIABILITY_SCALE={args.scale})", flush=True)
    status = subprocess.call(command, cwd=ROOT, env=env)
    print(f"\nreliability figures at scale {args.scale:g} ({report}):")
    for line in report.read_text().splitlines():
        figures = json.loads(line)
        extra = ", ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                          for key, value in figures["extra"].items())
        print(f"- {figures['scenario']}: {figures['sent']} sent, {figures['wrong']} wrong, {figures['errors']} errors "
              f"({figures['hidden_by_retry']} hidden by retry){'; ' + extra if extra else ''}")
    return status


if __name__ == "__main__":
    sys.exit(main())
