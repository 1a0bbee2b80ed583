"""What a policy's expressions see, and the limits they run within.

``RequestContext`` is what one request's evaluation reads and never changes (the request, its
namespace, params and context, the deadline). A ``View`` is the object as the mutations have
left it so far, with the param and context lists of the policy at hand: what the policies read
of it (CEL activations, its size) is made once and shared until it changes. A ``Scope`` is one
policy's view, with its variables computed lazily.

Before a policy runs, the request must fit it: objects CEL can read (``MAX_DEPTH``), and the
caller's deadline not passed (also checked before each expression); otherwise ``Abort`` and the
policy's failurePolicy decides, with a message that says which limit it was. Its size never
refuses a request: a policy whose estimated cost on it is over ``POLICY_BUDGET`` (``cel.estimation``)
runs apart, in a child process bounded in memory and by the deadline (``cel.fork``), and is
judged for real.
"""
from __future__ import annotations

import functools
import marshal
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, NamedTuple, TypeVar

from ..cel import POLICY_BUDGET, CelEvaluationError, CompiledExpression, estimation, fork, new_activation
from ..cel.lib import authz
from . import plugincalls
from .compiler import BoundPlugin, CompiledPolicy
from .inputs import Inputs, describe
from .patching import PatchError
from .plugincalls import PluginCallError
from .podcontrollers import pod_view
from .request import AdmissionRequest
from .verdicts import PluginCall, PolicyVerdict, Work

# CEL converts a bound object recursively in C++ on first read: at ~5,000-10,000 levels that
# overflows the thread's stack (8 MB) and kills the process. The API server accepts custom
# resources up to 10,000 levels deep, so deeper than this a policy cannot read the object.
MAX_DEPTH: Final = 2_000
# How long an expression run apart (``cel.fork``) may take when the caller set no deadline (the CLI).
UNBOUNDED_SECONDS: Final = 60.0

_Made = TypeVar("_Made")


class Abort(Exception):
    """Stop evaluating a policy (deadline, unreadable object): its failurePolicy decides."""


class MustFork(Exception):
    """Stop evaluating the request: a policy must run in a child process, and the caller may not
    wait for one (``RequestContext.may_fork``)."""


class Deadline(NamedTuple):
    """A time on ``clock`` after which no more CEL runs; ``at`` None: none (the CLI)."""
    at: float | None
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0

    @classmethod
    def start(cls, at: float | None, clock: Callable[[], float]) -> Deadline:
        return cls(at, clock, clock() if at is not None else 0.0)

    def left(self) -> float:
        """Seconds before the deadline; without one, what the webhook gives a request by default."""
        return self.at - self.clock() if self.at is not None else UNBOUNDED_SECONDS

    def check(self, before: str) -> None:
        if self.at is not None and self.clock() > self.at:
            raise Abort(f"evaluation deadline exceeded before {before} ({self.clock() - self.started:.2f} s "
                        "spent on this request; answering now, within the webhook timeout)")


class RequestContext(NamedTuple):
    """What one request's evaluation reads, the same for every policy (see ``evaluate``).
    A tuple: immutable, and made for every request at a tuple's cost."""
    request: AdmissionRequest
    namespace_object: Mapping[str, Any] | None
    namespace_error: str
    inputs: Inputs
    deadline: Deadline
    may_fork: bool


class View:
    """The object as the mutations have left it so far, with the param and context lists of the
    policy at hand. Shared by every policy while the object stays the same: an activation converts
    each value for CEL once, on first read, and a Pod is ~40 µs."""

    def __init__(self, context: RequestContext, work: Work, obj: Any,
                 param: Mapping[str, Any] | None = None, lists: Mapping[str, Any] | None = None) -> None:
        self.context = context
        self.work = work
        self.object = obj
        self.param = param
        self.lists: Mapping[str, Any] = lists or {}   # the ``context`` binding
        self._made: dict[Hashable, Any] = {}   # activations, sizes, ... (see kept)

    def replace(self, obj: Any) -> None:
        """The object a mutation made: what was made of the old one is gone with it."""
        if obj is not self.object:
            self.object = obj
            self._made.clear()

    def with_inputs(self, param: Mapping[str, Any] | None, lists: Mapping[str, Any]) -> View:
        return View(self.context, self.work, self.object, param, lists)

    def kept(self, key: Hashable, make: Callable[[], _Made]) -> _Made:
        """``make()``, once while the object and inputs stay the same."""
        if key not in self._made:
            self._made[key] = make()
        made: _Made = self._made[key]
        return made

    def bindings(self, policy: CompiledPolicy) -> dict[str, Any]:
        """The values a policy's expressions see (``variables`` apart); for a policy derived for
        Pod controllers, the objects are the Pods their templates stand for (``pod_view``)."""
        full = policy.reads_managed_fields
        new, old = self.object, self.context.request.old_object
        if policy.template:
            new, old = pod_view(new, policy.template), pod_view(old, policy.template)
        return {
            "object": _bound(new, full),
            "oldObject": _bound(old, full),
            "request": self.context.request.raw,
            "namespaceObject": _bound(self.context.namespace_object, full),
            "params": self.param,
            "context": self.lists,
            **(self.authorizer() if policy.reads_authorizer else {}),
        }

    def authorizer(self) -> dict[str, Any]:
        """``authorizer`` and ``authorizer.requestResource``: the requester, the request's resource
        (made for the policies that name ``authorizer``: most never do)."""
        return self.kept("authorizer", lambda: authz.bindings(self.context.request.raw))

    def activation(self, policy: CompiledPolicy) -> Any:
        """The shared activation, for programs that bind their own variables (or read none)."""
        key = (policy.reads_managed_fields, policy.template, policy.reads_authorizer)
        activation = self._made.get(key)   # the hot path: no closure made for kept()
        if activation is None:
            activation = self._made[key] = new_activation({**self.bindings(policy), "variables": {}})
        return activation

    def sizes(self, exact: bool) -> estimation.Sizes | str:
        """Bounds of what the policies read: the largest bound object's size and, with ``exact``,
        the most items in one of its lists or maps (else the size bounds both); or why CEL cannot
        read them. ``marshal`` (C, ~3 µs/kB) bounds the size and the depth; the exact walk is
        Python, for the requests that need it (large ones, on costly policies)."""
        sizes: estimation.Sizes | str | None = self._made.get(("sizes", exact))
        if sizes is None:
            request = self.context.request
            bodies = (self.object, request.old_object, self.context.namespace_object, request.raw, self.param)
            sizes = self._made["sizes", exact] = _measure(bodies, exact)
        return sizes

    def apart(self, policy: CompiledPolicy) -> bool:
        """Whether this policy runs apart on this request (``cel.fork``): when its estimated cost
        here is over POLICY_BUDGET. Never a refusal: the estimate is an upper bound, often far
        above what the evaluation really costs, and a legal object must be judged. Abort only
        past the deadline or for an object CEL cannot read (see the module doc)."""
        self.context.deadline.check("the policy ran")
        upper = self.sizes(exact=False)
        if isinstance(upper, str):
            raise Abort(upper)
        if policy.cost(upper) <= POLICY_BUDGET:
            return False
        exact = self.sizes(exact=True)
        assert not isinstance(exact, str)
        if policy.cost(exact) <= POLICY_BUDGET or not fork.AVAILABLE:
            return False
        if not self.context.may_fork:
            raise MustFork()
        return True

    def with_param(self) -> str:
        """Which param an error happened with, for its message."""
        return f" (with param {describe(self.param)})" if self.param is not None else ""


class Scope:
    """One policy's bindings for one state of the object, with its variables computed lazily:
    an expression evaluates only the variables it reads, each at most once."""

    def __init__(self, view: View, policy: CompiledPolicy, apart: bool | None = None) -> None:
        self.view = view
        self.policy = policy
        # Each expression runs in a child process (``cel.fork``); judged once per policy, on its first object.
        self.apart = view.apart(policy) if apart is None else apart
        self.values: dict[str, Any] = {}
        self.failed: dict[str, tuple[str, str]] = {}   # (path, message): no exception, see _variable
        self._activation: Any = None   # with ``values`` as ``variables``

    def evaluate(self, expression: CompiledExpression, *, plain: bool = True) -> Any:
        """``plain=False`` for a variable: its opaque values stay typed for the expressions that read it."""
        view = self.view
        view.context.deadline.check(expression.path)
        names = self.policy.variables if expression.variables is None else expression.variables
        if any(name not in self.values for name in names):
            for name in self.policy.variables:   # declaration order: dependencies come first
                if name in names:
                    self._variable(name)
        view.work.evaluations += 1
        if not names:
            activation = view.activation(self.policy)
        else:
            if self._activation is None:
                self._activation = new_activation({**view.bindings(self.policy), "variables": dict(self.values)})
            activation = self._activation
        if self.apart:
            return fork.evaluate(expression, activation, view.context.deadline.left(), plain=plain)
        return expression.evaluate(activation, plain=plain)

    def _variable(self, name: str) -> None:
        if name in self.values:
            return
        if name in self.failed:
            raise CelEvaluationError(*self.failed[name])
        try:
            value = self.evaluate(self.policy.variables[name], plain=False)
        except CelEvaluationError as error:
            # Kept as text: an exception kept here would hold, through its traceback, this scope
            # and its activation (megabytes for a large object) in a cycle until a full GC.
            self.failed[name] = (error.path, error.message)
            raise
        self.values[name] = value
        self._activation = None

    def fail(self, verdict: PolicyVerdict, error: CelEvaluationError | PatchError | PluginCallError,
             path: str = "", rule: str = "") -> bool:
        """Record an evaluation error (of ``rule``, else of the whole policy); True when the failure
        policy says to stop (Fail)."""
        text = (f"{path}: {error}" if path else str(error)) + self.view.with_param()
        return verdict.erred(self.policy, rule, text)

    def call(self, bound: BoundPlugin, answer: Callable[..., _Made], word: Callable[[_Made], str]) -> _Made:
        """``answer`` (``plugincalls.validate`` or ``mutate``: the plugin's checked answer) from a
        worker thread, on copies of the inputs: raising, answering other than documented, or not
        within the plugin's budget or the request's deadline, is a PluginCallError. The call is
        recorded with ``word(answer)`` (its result in the metrics), or "error"."""
        view, deadline = self.view, self.view.context.deadline
        deadline.check(bound.path)
        plugin = bound.plugin
        bindings = view.bindings(self.policy)
        # A mutator changes the object itself (never a Pod template: compiler); a validator judges what CEL does.
        obj = view.object if plugin.kind == "mutator" else bindings["object"]
        request = plugincalls.IsolatedRequest(obj, bindings["oldObject"], view.context.request.raw,
                                              bindings["namespaceObject"], params=view.param, context=view.lists)
        timeout, limit = plugin.time_budget, f"its budget of {plugin.time_budget * 1000:g} ms per call"
        left = deadline.left() if deadline.at is not None else timeout
        if left < timeout:
            timeout, limit = left, "the request's evaluation deadline"
        started = time.perf_counter()
        try:
            call = functools.partial(answer, plugin, bound.config, request)
            result: _Made = plugincalls.WORKERS.call(plugin.name, call, timeout, limit)
        except plugincalls.PluginFault as fault:
            view.work.plugin_calls.append(PluginCall(plugin.name, "error", time.perf_counter() - started))
            raise PluginCallError(bound.path, str(fault)) from None
        view.work.plugin_calls.append(PluginCall(plugin.name, word(result), time.perf_counter() - started))
        return result


def _bound(body: Any, managed_fields: bool) -> Any:
    """An object as a policy sees it: without ``metadata.managedFields`` unless it names them.

    They are the API server's bookkeeping of who set which field, often the largest part of an
    object, and CEL converts a bound object whole on first read: most of a Pod's ~40 µs.
    """
    metadata = body.get("metadata") if isinstance(body, Mapping) and not managed_fields else None
    if not isinstance(metadata, Mapping) or "managedFields" not in metadata:
        return body
    return {**body, "metadata": {key: value for key, value in metadata.items() if key != "managedFields"}}


def _measure(bodies: tuple[Any, ...], exact: bool) -> estimation.Sizes | str:
    """See View.sizes. marshal (format 2: no back-references) writes at least one byte per value
    and per character, so its length bounds the size, and it refuses nesting beyond ~2,000."""
    size, items = 0.0, 0.0
    for body in bodies:
        if body is None:
            continue
        try:
            if not exact:
                size = max(size, len(marshal.dumps(body, 2)))
                continue
        except ValueError:   # too deep, or not plain JSON data: the walk tells which
            pass
        walked = _walk(body)
        if isinstance(walked, str):
            return walked
        size, items = max(size, walked.size), max(items, walked.items)
    return estimation.Sizes(size, items if exact else size)


def _walk(body: Any) -> estimation.Sizes | str:
    """Size and largest list or map of one object, iteratively (it may be deep), or why CEL
    cannot read it."""
    size, items = 0, 0
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return (f"the object nests deeper than {MAX_DEPTH:,} levels, more than CEL can read without "
                    "exhausting the stack")
        if isinstance(value, Mapping):
            size, items = size + 1, max(items, len(value))
            for key, item in value.items():
                size += len(key) if isinstance(key, str) else 1
                stack.append((item, depth + 1))
        elif isinstance(value, (list, tuple)):
            size, items = size + 1, max(items, len(value))
            stack.extend((item, depth + 1) for item in value)
        else:
            size += len(value) if isinstance(value, str) else 1
    return estimation.Sizes(size, items)
