"""Settings shared by every test directory: hypothesis profiles for the fuzz tests (issue 12).

The helpers shared by every tier are plain modules here (``builders``, ``jsonpaths``), imported as
``from builders import policy``: pytest puts this directory on ``sys.path`` for this conftest (no
packages, rootdir-relative), as it puts each tier's directory there for that tier's own helpers
(``emulator``, ``e2e_kube``...). A test module never imports another test module.

``ci`` (the default) is bounded and deterministic, so CI never flakes and the fuzz suite stays
under a minute; ``HYPOTHESIS_PROFILE=long`` runs many more, random examples to hunt for defects:

    HYPOTHESIS_PROFILE=long python -m pytest tests/unit/test_fuzz_policy.py tests/operator/test_fuzz_webhook.py
"""
from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

# ci: examples come from the test's own source (derandomize). Neither profile keeps a database in
# the working tree (a failure prints the @reproduce_failure blob to replay it), and no per-example
# deadline applies: the machines tests run on are shared, and their timing varies.
_COMMON: dict[str, Any] = {"deadline": None, "database": None, "print_blob": True,
                           "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=2_000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "").strip() or "ci")
