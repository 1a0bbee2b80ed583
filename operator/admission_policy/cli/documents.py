"""Reading policy, object and suite files: every failure becomes one line naming the file."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from .. import api, policyexception
from ..config import SETTINGS
from ..engine import CompiledException, CompiledPolicy, PolicyCompileError, compile_exception, load_policy
from ..errors import AdmissionPolicyError

SUFFIXES = (".yaml", ".yml", ".json")
Found = tuple[str, dict[str, Any]]   # where an object was read ("file#2 items[0]"), and the object


class DocumentError(AdmissionPolicyError):
    """Unusable input: a file, a flag's value, a suite's field. The message names where and what is
    wrong; the CLI prints it and exits 2."""


@dataclasses.dataclass(frozen=True)
class Document:
    source: str          # "path" or "path#2" for the second document of a stream
    body: Any

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", "")) if isinstance(self.body, Mapping) else ""


def read_documents(path: Path | str, *, allow_empty: bool = True) -> list[Document]:
    """All YAML/JSON documents of a file ("-" is standard input).

    ``allow_empty=False`` is for a file named on purpose: one that holds nothing is a mistake (a
    wrong path, an unsaved buffer) worth a line of its own, not a vague "nothing found" later.
    """
    name = str(path)
    try:
        text = sys.stdin.read() if name == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DocumentError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"{name}: cannot read: {exc}") from None
    try:
        bodies = _parse(text)
    except RecursionError:
        raise DocumentError(f"{name}: nested too deeply to read (YAML here goes about 200 levels deep, "
                            "JSON about 1,000)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise DocumentError(f"{name}{where}: not valid YAML or JSON: {problem}") from None
    if not bodies and not allow_empty:
        raise DocumentError(f"{name}: the file is empty (no YAML or JSON document in it)")
    if len(bodies) == 1:
        return [Document(name, bodies[0])]
    return [Document(f"{name}#{i + 1}", body) for i, body in enumerate(bodies)]


def _parse(text: str) -> list[Any]:
    """The documents of a YAML stream; a JSON file is read as JSON first, whose reader nests about
    five times deeper than PyYAML's (each YAML level takes several Python frames)."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError:
            pass   # YAML flow style, or not valid: YAML says where
    return [body for body in yaml.safe_load_all(text) if body is not None]


def documents_in(root: Path | str, *, allow_empty: bool = False) -> Iterator[Document]:
    """The documents of a file (not empty, unless allowed), or of every file under a directory."""
    allow_empty = allow_empty or Path(root).is_dir()
    for file in walk(Path(root)):
        yield from read_documents(file, allow_empty=allow_empty)


def kubernetes_objects(document: Document) -> list[Found]:
    """The objects a document stands for, each with where it was read: the document itself, or a
    ``List``'s items (``kubectl get -o yaml``: "file#2 items[1]"). Anything else is an error naming it."""
    body = document.body
    if isinstance(body, dict) and str(body.get("kind", "")).endswith("List") and "items" in body:
        items = body["items"]
        if not isinstance(items, list):
            raise DocumentError(f"{document.source}: {body.get('kind')}.items must be a list")
        found = [(f"{document.source} items[{index}]", item) for index, item in enumerate(items) if item is not None]
    else:
        found = [(document.source, body)]
    for source, item in found:
        if not isinstance(item, dict) or not item.get("kind") or not item.get("apiVersion"):
            raise DocumentError(f"{source}: expected a Kubernetes object with apiVersion and kind")
    return found


def objects_in(root: Path | str) -> list[Found]:
    """Every object of a file or directory (multi-document YAML and Lists expanded); an empty file is
    an error, an empty directory holds none."""
    return [found for document in documents_in(root) for found in kubernetes_objects(document)]


def walk(path: Path) -> Iterator[Path]:
    """Files under a directory (sorted, so runs are repeatable), or the file itself."""
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    elif path.exists() or str(path) == "-":
        yield path
    else:
        raise DocumentError(f"{path}: no such file or directory")


def load_policies(paths: Iterable[Path | str], default_failure_policy: api.FailurePolicy = "Fail",
                  *, allow_empty: bool = False) -> list[CompiledPolicy]:
    """Compiled AdmissionPolicies and NamespacedAdmissionPolicies from files and directories
    (other kinds are skipped)."""
    policies: dict[str, tuple[str, CompiledPolicy]] = {}
    for root in paths:
        for document in documents_in(root, allow_empty=allow_empty):
            if document.kind not in api.POLICY_KINDS:
                continue
            policy = compile_document(document, default_failure_policy)
            if policy.name in policies:
                raise DocumentError(duplicate_policy(document, policy.name, policies[policy.name][0]))
            policies[policy.name] = (document.source, policy)
            # Evaluating goes on without the gated-off rules, as in the cluster; saying so keeps an
            # "allowed" from passing for a check that never ran.
            for warning in gated_off_warnings(document, policy):
                click.echo(f"warning: {warning}", err=True)
    return [policy for _, policy in policies.values()]


def load_exceptions(paths: Iterable[Path | str], *, allow_empty: bool = False) -> list[CompiledException]:
    """Compiled AdmissionPolicyExceptions from files and directories (other kinds are skipped)."""
    found: dict[str, tuple[str, CompiledException]] = {}
    for root in paths:
        for document in documents_in(root, allow_empty=allow_empty):
            if is_exception(document):
                compiled = compile_exception_document(document)
                if compiled.key in found:
                    raise DocumentError(f"{document.source}: AdmissionPolicyException {compiled.key!r} is also "
                                        f"defined in {found[compiled.key][0]}")
                found[compiled.key] = (document.source, compiled)
    return [compiled for _, compiled in found.values()]


def is_exception(document: Document) -> bool:
    return document.kind == policyexception.KIND


def compile_exception_document(document: Document) -> CompiledException:
    """Parse an exception and compile its conditions, or one line naming the file and the field."""
    try:
        return compile_exception(policyexception.parse_exception(document.body))
    except api.PolicyError as exc:
        name = object_name(document.body)
        raise DocumentError(f"{document.source}: invalid AdmissionPolicyException"
                            f"{f' {name!r}' if name else ''}: {exc}") from None


def checked_exceptions(exceptions: Iterable[CompiledException], policies: Iterable[CompiledPolicy],
                       where: str) -> list[CompiledException]:
    """The exceptions, once each names policies and rules that exist (``check_references``): a typo
    would otherwise make every case that relies on the exception fail for another reason."""
    specs = [policy.policy for policy in policies]
    chosen = list(exceptions)
    for compiled in chosen:
        problems = policyexception.check_references(compiled.exception, specs)
        if problems:
            raise DocumentError(f"{where}: AdmissionPolicyException {compiled.key!r}: " + "; ".join(problems))
    return chosen


def gated_off_warnings(document: Document, policy: CompiledPolicy) -> list[str]:
    """One line per plugin rule a feature gate switches off, naming the file, policy, plugin and gate."""
    return [f"{document.source}: {policy.policy.kind} {policy.name!r}: {text}" for text in policy.gated_off]


def compile_document(document: Document, default_failure_policy: api.FailurePolicy = "Fail") -> CompiledPolicy:
    """Parse and compile a policy with the function the operator's validating webhook calls, so
    what it refuses here is what `kubectl apply` would refuse: for a NamespacedAdmissionPolicy,
    with the plugins AP_TENANT_PLUGINS allows, as the operator reads it (the cluster's limits and
    discovery checks need the cluster: ``operator.tenancy``)."""
    allowed = tenant_plugins(document.source) if document.kind == api.NAMESPACED_KIND else ()
    try:
        return load_policy(document.body, default_failure_policy, allowed)
    except (api.PolicyError, PolicyCompileError) as exc:
        raise DocumentError("\n".join(_compile_error_lines(document, exc))) from None


def tenant_plugins(where: str) -> tuple[str, ...]:
    """AP_TENANT_PLUGINS from the environment (none when unset, as in the cluster). Only tenant
    policies read it, so a bad value is an error of the one at ``where``, not of every file."""
    setting = SETTINGS["tenant_plugins"]
    raw = os.environ.get(setting.env, "").strip()
    try:
        return tuple(setting.parse(raw, setting.env)) if raw else ()
    except ValueError as exc:
        raise DocumentError(f"{where}: {exc}") from None


def _compile_error_lines(document: Document, error: api.PolicyError | PolicyCompileError) -> list[str]:
    """One line per problem, each naming the file, the policy, the field path and, for CEL, the column."""
    kind = policy_kind(document)
    if isinstance(error, PolicyCompileError):
        return [f"{document.source}: {kind} {error.policy!r}: {problem}" for problem in error.errors]
    name = policy_name(document)
    return [f"{document.source}: invalid {kind}{f' {name!r}' if name else ''}: {error}"]


def policy_kind(document: Document) -> str:
    """AdmissionPolicy or NamespacedAdmissionPolicy (a file may leave ``kind`` out of a policy)."""
    return document.kind if document.kind in api.POLICY_KINDS else api.KIND


def policy_name(document: Document) -> str:
    """The name a policy goes by, as the engine and the reports name it: "namespace/name" for a
    NamespacedAdmissionPolicy; read from a body that may not parse ("" when it has no name)."""
    name = object_name(document.body)
    metadata = document.body.get("metadata") if isinstance(document.body, Mapping) else None
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    tenant = document.kind == api.NAMESPACED_KIND and isinstance(namespace, str) and namespace
    return str(api.PolicyKey(document.kind, namespace, name)) if name and tenant else name


def object_name(body: Any) -> str:
    """``metadata.name``, or "" for a body too malformed to have one."""
    metadata = body.get("metadata") if isinstance(body, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def duplicate_policy(document: Document, name: str, first_source: str) -> str:
    return f"{document.source}: {policy_kind(document)} {name!r} is also defined in {first_source}"


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)
