"""The evaluations that wait for a child process run on threads of their own, not on the loop.

A policy too costly on a request to run in the operator's process runs in a forked child
(``cel.fork``), and whoever evaluates waits for the child, up to the request's deadline. On the
event loop that wait would stop every other admission request, probe and watch of the replica
(one user's large ConfigMap could stall them all for seconds), so the webhook and the audit
evaluate on the loop with ``may_fork=False`` and, only when the engine answers ``forks``, again
here. The thread waits in ``select()``, which releases the GIL: the loop serves on meanwhile.

What the evaluation reads is safe to read from a thread: the policy and exception sets are
immutable and swapped whole, the namespace object is looked up beforehand, and the params and
context caches hand out snapshots copied in one step (``sources.SourceCache.listing``).
Forking from one of these threads is safe: see ``cel.fork``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import Final, TypeVar

# Requests evaluated apart at once; more wait for a thread (and may reach their deadline).
WORKERS: Final = 4
_Result = TypeVar("_Result")
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="admission-policy apart")


async def run_apart(function: Callable[..., _Result], /, *args: object, **kwargs: object) -> _Result:
    """``function(*args, **kwargs)`` on a thread of the pool, awaited without blocking the loop."""
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(function, *args, **kwargs))
