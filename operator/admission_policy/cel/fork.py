"""Evaluate one expression in a forked child: bounded in memory and time, whatever it does.

The C++ core holds the GIL for a whole evaluation and cannot be interrupted, so an expression
that is slow or greedy on a large object would stall every other request of the process, or
take its memory. Kubernetes meters cost while it evaluates; cel-expr-python cannot. The engine
therefore runs a policy whose estimated cost on the request at hand is over its budget (the
estimate is an upper bound, often far above what the evaluation really does) in a child
process: ``fork()`` shares the compiled program and the bound object copy-on-write, the child
gets an address-space limit and is the kernel's first choice of an OOM victim, and the parent
kills it at the deadline. The answer is then the real one, never a refusal for the object's size.

The operator forks from a thread (``operator/apart.py``: the event loop must not wait) of a
process with other threads (plugin workers, asyncio's). That is safe for what the child does: it
evaluates one CEL expression, pickles the result and exits. The forking thread holds the GIL and
the CEL core never releases it, so no other thread is inside CEL or Python code at that moment;
glibc keeps malloc consistent across a fork; the child calls no plugin (plugins run in the
parent), does no I/O but its pipe, and takes no lock another thread may hold. Python 3.12 warns
at every fork of a process with threads; that warning is silenced here, for this module only.
A child that hung all the same would be killed at the deadline: an evaluation error, never a
stalled replica.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import time
import warnings
from typing import Any, Final

from .environment import CelEvaluationError, CompiledExpression

# What a child may allocate beyond what the process had mapped when it forked.
MEMORY: Final = 256 * 2**20
AVAILABLE: Final = hasattr(os, "fork")
_OK, _ERROR = 0, 1
warnings.filterwarnings("ignore", message=r".*multi-threaded, use of fork\(\) may lead to deadlocks",
                        category=DeprecationWarning, module=__name__)


def evaluate(expression: CompiledExpression, activation: Any, seconds: float, *, plain: bool = True) -> Any:
    """``expression.evaluate(activation)``, in a child: its value or CelEvaluationError; a child
    that runs out of memory or time is an evaluation error that says so."""
    if not AVAILABLE:
        return expression.evaluate(activation, plain=plain)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns
        os.close(read)
        _child(expression, activation, write, plain)
    os.close(write)
    try:
        data, finished = _collect(read, time.monotonic() + max(seconds, 0.0))
    finally:
        os.close(read)
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if not finished:
        raise CelEvaluationError(expression.path, f"did not finish within {seconds:.2f} s, the time left before the "
                                 "request's deadline (run apart from the webhook, as its estimated cost on this "
                                 "request is high)")
    if not data:
        cause = (f"was killed by signal {os.WTERMSIG(status)}, most likely for using more than "
                 f"{MEMORY // 2**20} MiB" if os.WIFSIGNALED(status) else "failed without an answer")
        raise CelEvaluationError(expression.path, f"{cause} (run apart from the webhook, as its estimated cost on "
                                 "this request is high)")
    kind, value = pickle.loads(data)
    if kind == _ERROR:
        raise CelEvaluationError(expression.path, value)
    return value


def _child(expression: CompiledExpression, activation: Any, pipe: int, plain: bool) -> None:
    code = 1
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:   # the cgroup's OOM killer takes the child first
            adj.write("1000")
    except OSError:
        pass
    try:
        mapped = _mapped_bytes()
        if mapped:
            resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY, mapped + MEMORY))
        try:
            result: tuple[int, Any] = (_OK, expression.evaluate(activation, plain=plain))
        except CelEvaluationError as error:
            result = (_ERROR, error.message)
        data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(pipe, view):]
        code = 0
    except BaseException:   # nothing of the parent's (handlers, atexit, buffers) runs in the child
        pass
    finally:
        os._exit(code)


def _collect(pipe: int, deadline: float) -> tuple[bytes, bool]:
    """What the child wrote, and whether it closed its end before the deadline."""
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"", False
        ready, _, _ = select.select([pipe], [], [], left)
        if not ready:
            return b"", False
        chunk = os.read(pipe, 1 << 16)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


def _mapped_bytes() -> int:
    """The process's virtual size (the address-space limit counts every mapping), or 0."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
