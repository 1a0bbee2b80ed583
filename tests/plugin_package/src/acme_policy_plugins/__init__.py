"""A plugin in its own package: ``label-checksum`` requires ``metadata.annotations[<annotation>]``
to be the SHA-256 of ``metadata.labels[<label>]`` (CEL has no hash functions)."""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from admission_policy.plugins import Failure, PluginRequest, Stage, ValidatorPlugin


class LabelChecksum(ValidatorPlugin):
    name: ClassVar[str] = "label-checksum"
    version: ClassVar[str] = "0.1.0"
    description: ClassVar[str] = "An annotation must hold the SHA-256 of a label."
    stage: ClassVar[Stage] = "Alpha"   # off until --feature-gates=LabelChecksumPlugin=true
    config_schema: ClassVar[Mapping[str, Any]] = {
        "type": "object", "required": ["label", "annotation"], "additionalProperties": False,
        "properties": {"label": {"type": "string", "minLength": 1}, "annotation": {"type": "string", "minLength": 1}},
    }

    def validate(self, config: Mapping[str, Any], request: PluginRequest) -> Sequence[Failure]:
        metadata = (request.object or {}).get("metadata") or {}
        value = (metadata.get("labels") or {}).get(config["label"])
        if value is None:
            return []
        wanted = hashlib.sha256(value.encode()).hexdigest()
        if (metadata.get("annotations") or {}).get(config["annotation"]) != wanted:
            return [Failure(f"must be the sha256 of label {config['label']}: {wanted}",
                            f"metadata.annotations[{config['annotation']}]")]
        return []
