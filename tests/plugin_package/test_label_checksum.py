"""The plugin's own test, as its authors would write it (run by tests/unit/test_plugins.py too)."""
from __future__ import annotations

import hashlib

from acme_policy_plugins import LabelChecksum

from admission_policy.plugins import PluginRequest


def test_a_wrong_checksum_fails_and_a_right_one_passes() -> None:
    plugin = LabelChecksum()
    config = plugin.configure({"label": "app", "annotation": "acme.com/app-sha"})
    pod = {"metadata": {"labels": {"app": "web"}, "annotations": {"acme.com/app-sha": "x"}}}
    assert plugin.validate(config, PluginRequest(pod, None, {"operation": "CREATE"}))
    pod["metadata"]["annotations"]["acme.com/app-sha"] = hashlib.sha256(b"web").hexdigest()
    assert not plugin.validate(config, PluginRequest(pod, None, {"operation": "CREATE"}))
