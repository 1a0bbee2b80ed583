"""Calling Python plugins so that none can hurt the server: a plugin that loops, blocks, raises
anything, edits what it is given or returns what JSON cannot carry costs its own policy an
evaluation error (the policy's failurePolicy decides), answered in time, and nothing more.

- **Time** (``WORKERS``): a call runs on a worker thread of a small pool the engine owns, and the
  evaluating thread (the operator's event loop) waits for it at most the plugin's ``time_budget``
  or what is left of the request's deadline. A call still running then is abandoned: the answer
  is an error at once, ``CallStopped`` is raised in its thread (``PyThreadState_SetAsyncExc``:
  that ends Python code at its next bytecode, not a call blocked in C such as a sleep), it is
  logged once at ERROR, and until it returns the plugin's further calls fail at once without a
  thread. So at most one thread per plugin is ever stuck, and never more than ``MAX_WORKERS`` exist.
- **Inputs** (``IsolatedRequest``): the plugin reads copies, made on first read, so nothing it
  does to them reaches other policies, later plugins, the response or the operator's caches,
  and it pays only for what it reads (a context list is copied one object at a time).
- **Results** (``validate``, ``mutate``): checked on the worker, within the budget, to be what the
  contract says, and copied as plain JSON data, so a plugin keeping what it returned cannot
  change it afterwards.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import marshal
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, overload

from ..errors import AdmissionPolicyError
from ..plugins import Failure, MutatorPlugin, Plugin, PluginRequest, ValidatorPlugin, field_path
from .patching import clone

logger = logging.getLogger(__name__)

# Threads: one per thread evaluating (the operator has one), plus one per plugin whose call overran.
MAX_WORKERS: Final = 8
OPERATIONS: Final = frozenset({"add", "copy", "move", "remove", "replace", "test"})
JSON_DATA: Final = "objects with string keys, arrays, strings, finite numbers, true, false and null"


class PluginFault(AdmissionPolicyError):
    """A plugin call without a usable answer; the message names the plugin."""


class PluginCallError(AdmissionPolicyError):
    """A plugin that raised, overran its time budget or returned something else than documented:
    an evaluation error of the policy that called it (its failurePolicy decides)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class CallStopped(BaseException):
    """Raised in a worker whose call overran. A BaseException: a plugin's ``except Exception``
    does not swallow it."""


# --- time ---------------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class _Call:
    plugin: str
    function: Callable[[], Any]
    since: float = dataclasses.field(default_factory=time.monotonic)
    started: bool = False
    value: Any = None
    error: BaseException | None = None
    # Under the pool's lock: the worker is done with it; what it overran when the caller gave up on it.
    finished: bool = False
    overran: str = ""
    done: threading.Lock = dataclasses.field(default_factory=threading.Lock)   # held until finished

    def run(self) -> None:
        self.started = True
        try:
            self.value = self.function()
        except BaseException as exc:   # SystemExit and CallStopped too: the caller decides
            self.error = exc


class _Worker:
    """A daemon thread (a runaway never holds up the process's exit) running the calls it is given."""

    def __init__(self, pool: Workers, number: int) -> None:
        self.pool = pool
        self.call: _Call | None = None
        # One token per call given (C, so a stop arriving cannot leave it half taken); a token left
        # over when a call was taken without waiting only makes the next wait go round once more.
        self.wake = queue.SimpleQueue[None]()
        self.thread = threading.Thread(target=self._serve, name=f"admission-policy plugin worker {number}",
                                       daemon=True)
        self.thread.start()

    def give(self, call: _Call) -> None:
        call.done.acquire()
        self.call = call
        self.wake.put(None)

    def _serve(self) -> None:
        # One step per turn, its state in self.call: CallStopped, sent at most once per call and
        # never after Workers.settle cleared it, may arrive at any step (before the call started,
        # just after it returned), and the next turns settle the call all the same.
        while True:
            try:
                call = self.call
                if call is None:
                    self.wake.get()
                elif not call.started:
                    call.run()
                else:
                    self.pool.settle(self, call)
            except CallStopped:
                if self.call is not None:
                    self.call.started = True   # abandoned: not to be run


class Workers:
    """The engine's plugin threads (see the module doc)."""

    def __init__(self, limit: int = MAX_WORKERS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._started = 0
        self._overrunning: dict[str, _Call] = {}   # plugin name → its call still running past its limit

    def call(self, plugin: str, function: Callable[[], Any], timeout: float, limit: str) -> Any:
        """``function()`` run on a worker for ``plugin``. PluginFault when it raises (but
        KeyboardInterrupt), when it has not returned after ``timeout`` seconds (``limit`` says
        what that is: "its budget of 50 ms per call"), or while an earlier call still overruns."""
        worker, call = self._dispatch(plugin, function)
        # NaN or negative: no wait; beyond what a lock can wait: as long as it can.
        if not call.done.acquire(timeout=min(timeout, threading.TIMEOUT_MAX) if timeout > 0 else 0) \
                and self._abandon(worker, call, limit):
            raise PluginFault(f"plugin {plugin!r} did not return within {limit}; its call is being stopped, and "
                              "its further calls fail until it returns")
        error = call.error
        if error is None:
            return call.value
        if isinstance(error, (KeyboardInterrupt, PluginFault)):
            raise error
        raise PluginFault(f"plugin {plugin!r} raised {type(error).__name__}: {error}")

    def overrunning(self) -> list[str]:
        """The plugins with a call still running past its budget (or deadline)."""
        with self._lock:
            return sorted(self._overrunning)

    def _dispatch(self, plugin: str, function: Callable[[], Any]) -> tuple[_Worker, _Call]:
        call = _Call(plugin, function)
        with self._lock:
            running = self._overrunning.get(plugin)
            if running is not None:
                age = time.monotonic() - running.since
                raise PluginFault(f"plugin {plugin!r} was not called: its call of {age:.1f} s ago, which did not "
                                  f"return within {running.overran}, is still running")
            if self._idle:
                worker = self._idle.pop()
            elif self._started < self.limit:
                self._started += 1
                worker = _Worker(self, self._started)
            else:
                stuck = ", ".join(sorted(self._overrunning))
                raise PluginFault(f"plugin {plugin!r} was not called: all {self.limit} plugin workers are busy, "
                                  f"with calls still running past their budgets: {stuck}")
        worker.give(call)
        return worker, call

    def _abandon(self, worker: _Worker, call: _Call, limit: str) -> bool:
        """Give up on a call still running: True, once it is marked and being stopped; False when it
        finished meanwhile."""
        with self._lock:
            if call.finished:
                return False
            call.overran = limit
            self._overrunning[call.plugin] = call
            _raise_in(worker.thread.ident, CallStopped)
        logger.error("Plugin %r did not return within %s and is still running: its rules get their policies' "
                     "failurePolicy answer, and its calls fail at once until this one returns (it is being stopped)",
                     call.plugin, limit)
        return True

    def settle(self, worker: _Worker, call: _Call) -> None:
        """The worker's end of a call: it is idle again, and the caller, if still waiting, wakes."""
        with self._lock:
            call.finished = True
            if call.overran:
                # A stop sent but not raised yet is dropped here, or raised just before: then the
                # worker's next turn comes back here.
                _raise_in(worker.thread.ident, None)
                if self._overrunning.get(call.plugin) is call:
                    del self._overrunning[call.plugin]
            worker.call = None
            self._idle.append(worker)
        call.done.release()
        if call.overran:
            logger.warning("Plugin %r: the call that did not return within %s ended after %.1f s; its calls run again",
                           call.plugin, call.overran, time.monotonic() - call.since)


def _raise_in(thread: int | None, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in ``thread`` at its next bytecode; None drops one not raised yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread or 0),
                                               None if exception is None else ctypes.py_object(exception))


WORKERS: Final = Workers()


# --- inputs -------------------------------------------------------------------------------------

class IsolatedRequest(PluginRequest):
    """What the engine gives a plugin: a PluginRequest whose values are the plugin's own copies,
    each made when first read; a context list copies one object at a time, as it is read."""
    _sources: dict[str, Any]
    _copies: dict[str, Any]

    def __init__(self, object: Any, old_object: Any, request: Mapping[str, Any],
                 namespace_object: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
                 context: Mapping[str, Sequence[Any]] | None = None) -> None:
        # Not the dataclass's __init__: the fields are the properties below.
        super().__setattr__("_sources", {"object": object, "old_object": old_object, "request": request,
                                         "namespace_object": namespace_object, "params": params})
        lists = {name: _CopiedList(objects) for name, objects in (context or {}).items()}
        super().__setattr__("_copies", {"context": lists})

    def _copy(self, name: str) -> Any:
        copies = self._copies
        if name not in copies:
            copies[name] = copied(self._sources[name])
        return copies[name]

    @property
    def object(self) -> Any:
        return self._copy("object")

    @property
    def old_object(self) -> Any:
        return self._copy("old_object")

    @property
    def request(self) -> Mapping[str, Any]:
        return self._copy("request")  # type: ignore[no-any-return]

    @property
    def namespace_object(self) -> Mapping[str, Any] | None:
        return self._copy("namespace_object")  # type: ignore[no-any-return]

    @property
    def params(self) -> Mapping[str, Any] | None:
        return self._copy("params")  # type: ignore[no-any-return]

    @property
    def context(self) -> Mapping[str, Sequence[Any]]:
        return self._copies["context"]  # type: ignore[no-any-return]

    @property
    def operation(self) -> str:   # a str, nothing to isolate: no copy of the whole request for it
        return str(self._sources["request"].get("operation", ""))


def copied(value: Any) -> Any:
    """A deep copy of JSON data, through marshal (C: a third of ``clone``'s time on a Pod); by
    ``clone`` what marshal refuses (nesting past ~2,000 levels, dict or str subclasses)."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return clone(value)


class _CopiedList(Sequence[Any]):
    """A read-only list whose items are copied when first read, and kept: a context list may hold
    thousands of objects, of which a plugin may read a few."""
    __slots__ = ("_copies", "_source")

    def __init__(self, source: Sequence[Any]) -> None:
        self._source, self._copies = source, dict[int, Any]()

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._source)))]
        count = len(self._source)
        if not -count <= index < count:
            raise IndexError("context list index out of range")
        index %= count
        copies = self._copies
        if index not in copies:
            copies[index] = copied(self._source[index])
        return copies[index]

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self._source)))

    def __len__(self) -> int:
        return len(self._source)

    def __repr__(self) -> str:
        return repr(list(self))


# --- results ------------------------------------------------------------------------------------

def validate(plugin: Plugin, config: Any, request: PluginRequest) -> list[str]:
    """A validator's failures as messages; PluginFault unless it returned a list of them, each a
    non-empty str or a Failure with a non-empty str message (and a str field)."""
    assert isinstance(plugin, ValidatorPlugin)
    result = plugin.validate(config, request)
    if not isinstance(result, (list, tuple)):
        raise PluginFault(f"plugin {plugin.name!r} returned {type(result).__name__}, not a list of failures "
                          "(str or Failure)")
    messages = []
    for index, failure in enumerate(result):
        message, field = (failure.message, failure.field) if isinstance(failure, Failure) else (failure, "")
        if not (isinstance(message, str) and message.strip() and isinstance(field, str)):
            what = f"a Failure with message {_shown(message)} and field {_shown(field)}" \
                if isinstance(failure, Failure) else _shown(failure)
            raise PluginFault(f"plugin {plugin.name!r} returned {what} at [{index}]: a failure is a non-empty str, "
                              "or a Failure with a non-empty str message (and a str field)")
        messages.append(str(failure))
    return messages


def mutate(plugin: Plugin, config: Any, request: PluginRequest) -> dict[str, Any] | list[dict[str, Any]] | None:
    """A mutator's answer as plain JSON data of the engine's own: the new object, the JSON patch's
    operations, or None; PluginFault naming the plugin, and the place, for anything else."""
    assert isinstance(plugin, MutatorPlugin)
    result = plugin.mutate(config, request)
    if result is None:
        return None
    if isinstance(result, Mapping):
        return json_data(plugin.name, result)  # type: ignore[no-any-return]
    if not isinstance(result, (list, tuple)):
        raise PluginFault(f"plugin {plugin.name!r} returned {type(result).__name__}, not a JSON patch (a list of "
                          "operations), an object or None")
    operations: list[dict[str, Any]] = json_data(plugin.name, result)
    for index, operation in enumerate(operations):
        problem = _operation_problem(operation)
        if problem:
            raise PluginFault(f"plugin {plugin.name!r} returned a JSON patch whose operation [{index}] {problem}")
    return operations


def _operation_problem(operation: Any) -> str:
    """What makes ``operation`` (JSON data) not an RFC 6902 operation, or ""."""
    if not isinstance(operation, dict):
        return f"is {_shown(operation)}, not an object"
    op = operation.get("op")
    if not isinstance(op, str) or op not in OPERATIONS:
        return f"has op {_shown(op)}, not one of {', '.join(sorted(OPERATIONS))}"
    for key in ("path", "from") if op in ("move", "copy") else ("path",):
        if not isinstance(operation.get(key), str):
            return f"({op}) has {key} {_shown(operation.get(key))}, not a JSON pointer string"
    if op in ("add", "replace", "test") and "value" not in operation:
        return f"({op}) has no value"
    return ""


def json_data(plugin: str, value: Any) -> Any:
    """A plain copy of ``value`` when it is JSON data (any Mapping with str keys, lists and tuples,
    str, int, finite float, bool, None); else PluginFault naming the plugin and where. Iterative:
    what a plugin returns may nest deep."""
    root: list[Any] = [None]
    # (value, where its copy goes, under which key, the path to it as (parent's path, key))
    pending: list[tuple[Any, Any, Any, tuple[Any, ...]]] = [(value, root, 0, ())]
    while pending:
        item, parent, key, trail = pending.pop()
        if isinstance(item, (str, int)) or item is None:   # bool is an int
            parent[key] = item
        elif isinstance(item, float):
            if not math.isfinite(item):
                found = "NaN" if math.isnan(item) else "Infinity"
                raise _not_json(plugin, found, trail, "which is not a JSON number and cannot go into a patch")
            parent[key] = item
        elif isinstance(item, Mapping):
            mapping = parent[key] = dict[str, Any]()
            for name, child in item.items():
                if not isinstance(name, str):
                    raise _not_json(plugin, f"{_shown(name)} as a key", trail, "but keys of JSON objects are strings")
                mapping[name] = None   # keeps the order
                pending.append((child, mapping, name, (trail, name)))
        elif isinstance(item, (list, tuple)):
            array = parent[key] = [None] * len(item)
            pending.extend((child, array, index, (trail, index)) for index, child in enumerate(item))
        else:
            raise _not_json(plugin, _shown(item), trail, f"which is not JSON data ({JSON_DATA})")
    return root[0]


def _not_json(plugin: str, found: str, trail: tuple[Any, ...], why: str) -> PluginFault:
    keys = []
    while trail:
        trail, key = trail
        keys.append(key)
    at = f" at {field_path(keys[::-1])}" if keys else ""
    return PluginFault(f"plugin {plugin!r} returned {found}{at}, {why}")


def _shown(value: Any) -> str:
    """A value in a message: a short str or None, else what type it is."""
    if value is None or isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"
