"""Reading policy, object and suite files: every failure becomes one line naming the file."""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from .. import api
from ..engine import CompiledPolicy, PolicyCompileError, compile_policy

SUFFIXES = (".yaml", ".yml", ".json")


class InputError(Exception):
    """Unusable input; the message names the file and the problem (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Document:
    source: str          # "path" or "path#2" for the second document of a stream
    body: Any

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", "")) if isinstance(self.body, Mapping) else ""


def read_documents(path: Path | str) -> list[Document]:
    """All YAML/JSON documents of a file ("-" is standard input)."""
    name = str(path)
    try:
        text = sys.stdin.read() if name == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{name}: cannot read: {exc}") from None
    try:
        bodies = [body for body in yaml.safe_load_all(text) if body is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{name}{where}: not valid YAML or JSON: {problem}") from None
    if len(bodies) == 1:
        return [Document(name, bodies[0])]
    return [Document(f"{name}#{i + 1}", body) for i, body in enumerate(bodies)]


def walk(path: Path) -> Iterator[Path]:
    """Files under a directory (sorted, so runs are repeatable), or the file itself."""
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    elif path.exists() or str(path) == "-":
        yield path
    else:
        raise InputError(f"{path}: no such file or directory")


def load_policies(paths: Iterable[Path | str], default_failure_policy: api.FailurePolicy = "Fail",
                  ) -> list[CompiledPolicy]:
    """Compiled AdmissionPolicies from files and directories (other kinds are skipped)."""
    policies: dict[str, tuple[str, CompiledPolicy]] = {}
    for root in paths:
        for file in walk(Path(root)):
            for document in read_documents(file):
                if document.kind != api.KIND:
                    continue
                policy = compile_document(document, default_failure_policy)
                if policy.name in policies:
                    raise InputError(f"{document.source}: AdmissionPolicy {policy.name!r} is also defined "
                                     f"in {policies[policy.name][0]}")
                policies[policy.name] = (document.source, policy)
    return [policy for _, policy in policies.values()]


def compile_document(document: Document, default_failure_policy: api.FailurePolicy = "Fail") -> CompiledPolicy:
    try:
        return compile_policy(api.parse_policy(document.body, default_failure_policy=default_failure_policy))
    except api.PolicyError as exc:
        raise InputError(f"{document.source}: invalid AdmissionPolicy: {exc}") from None
    except PolicyCompileError as exc:
        lines = [f"{document.source}: AdmissionPolicy {exc.policy!r}: {error}" for error in exc.errors]
        raise InputError("\n".join(lines)) from None


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)
