"""A caller at a boundary (the CLI, the webhook, a program using the package) catches the
package's refusals with one class, ``errors.AdmissionPolicyError``; code that caught them as
ValueError before still does."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from admission_policy import api, features, plugins
from admission_policy.engine import compile_policy, parse_review
from admission_policy.errors import AdmissionPolicyError

BAD_CEL = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "p"},
           "spec": {"match": {"resources": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                             "operations": ["CREATE"]}]},
                    "validations": [{"expression": "object.spec +"}]}}


@pytest.mark.parametrize("refused", [
    pytest.param(lambda: api.parse_policy({"kind": "Other"}), id="a malformed policy"),
    pytest.param(lambda: compile_policy(api.parse_policy(BAD_CEL)), id="a policy whose CEL does not compile"),
    pytest.param(lambda: parse_review({"kind": "AdmissionReview", "request": None}), id="a malformed review"),
    pytest.param(lambda: features.parse("NoSuchGate=true", plugins.Registry({}, {})), id="an unknown feature gate"),
])
def test_every_refusal_is_one_catchable_error_and_still_a_value_error(refused: Callable[[], Any]) -> None:
    with pytest.raises(AdmissionPolicyError) as caught:
        refused()
    assert isinstance(caught.value, ValueError)
