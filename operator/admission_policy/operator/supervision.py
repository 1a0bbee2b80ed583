"""Keeping the operator's background tasks alive, and saying so when that fails.

Each background task (a watcher, the configurations' writer, certificate renewal, ...) is an
endless loop that handles the failures it expects itself. An exception that escapes one is a bug
or a surprise; left dead, its work stops silently while the probes stay green. So a task that dies
is restarted after a backoff (``BACKOFF`` doubling up to ``MAX_BACKOFF``), as Kopf restarts a
failed daemon, and one that dies ``DEATHS`` times within ``WINDOW`` is left dead and reported in
the probes instead: restarting it for ever would hide the failure (docs/design.md, "Background
tasks").

A task that returns has done its job (the heap freeze, an audit switched off): that is no death.
Neither is a cancellation asked for (shutdown).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

logger = logging.getLogger(__name__)

BACKOFF = 1.0          # the first restart's delay; it doubles with each death within WINDOW
MAX_BACKOFF = 30.0
DEATHS = 8             # deaths within WINDOW after which a task is left dead
WINDOW = 900.0         # seconds: a task dying less often than DEATHS per WINDOW is restarted for ever


@dataclasses.dataclass
class Supervised:
    """One background task across its restarts."""
    name: str
    start: Callable[[], Awaitable[object]]
    essential: bool
    deaths: collections.deque[float] = dataclasses.field(default_factory=collections.deque)
    restarts: int = 0
    given_up: str = ""    # why it is left dead; "" while it runs (or has finished)
    task: asyncio.Task[None] | None = None


class Supervisor:
    """The operator's background tasks: started, restarted, reported, and stopped together.

    ``essential`` tasks are those admission answers depend on (the policies, namespaces, caches,
    configurations, certificates); one left dead makes the replica neither ready nor live, since
    a fresh process is the cure. Any other left dead is only reported: failing readiness for, say,
    the event poster would take away a webhook that still answers correctly.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.supervised: dict[str, Supervised] = {}

    def spawn(self, name: str, start: Callable[[], Awaitable[object]], *, essential: bool = True) -> None:
        """Run ``start()`` as a task named ``name``, restarting it should it die."""
        entry = self.supervised[name] = Supervised(name, start, essential)
        entry.task = asyncio.create_task(self._keep_alive(entry), name=f"admission-policy: {name}")

    def given_up(self, *, essential: bool) -> str:
        """The tasks left dead, essential or not, for the probes ("" when none)."""
        return "; ".join(f"background task {entry.name!r} stopped: {entry.given_up}"
                         for entry in self.supervised.values() if entry.given_up and entry.essential == essential)

    def stats(self) -> Iterator[tuple[str, int, bool]]:
        """Per task: its name, how often it was restarted, whether it is left dead (the metrics)."""
        for entry in self.supervised.values():
            yield entry.name, entry.restarts, bool(entry.given_up)

    async def stop(self) -> None:
        """Cancel every task and wait for them: a shutdown, not a death."""
        tasks = [entry.task for entry in self.supervised.values() if entry.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep_alive(self, entry: Supervised) -> None:
        while True:
            try:
                await entry.start()
                return
            except asyncio.CancelledError as exc:
                current = asyncio.current_task()
                if current is None or current.cancelling():
                    raise
                error: BaseException = exc   # a CancelledError nobody asked for: something inside failed
            except Exception as exc:
                error = exc
            delay = self._died(entry, error)
            if delay is None:
                return
            await asyncio.sleep(delay)
            entry.restarts += 1

    def _died(self, entry: Supervised, error: BaseException) -> float | None:
        """Count the death; the delay before the restart, or None to leave the task dead."""
        now = self.clock()
        entry.deaths.append(now)
        while entry.deaths and entry.deaths[0] <= now - WINDOW:
            entry.deaths.popleft()
        if len(entry.deaths) >= DEATHS:
            entry.given_up = f"died {len(entry.deaths)} times within {WINDOW:.0f}s, last: {error!r}"
            logger.error("Background task %r died %d times within %.0fs and is not restarted again%s: %r",
                         entry.name, len(entry.deaths), WINDOW,
                         "; the replica reports itself neither ready nor live" if entry.essential else "",
                         error, exc_info=error)
            return None
        delay = backoff(len(entry.deaths))
        logger.error("Background task %r died, restarting it in %.0fs: %r", entry.name, delay, error,
                     exc_info=error)
        return delay


def backoff(deaths: int) -> float:
    """The delay before a restart, after ``deaths`` deaths within ``WINDOW``: a task that died once
    is back at once, one that keeps dying does not spin (nor flood the log)."""
    return min(BACKOFF * 2.0 ** (deaths - 1), MAX_BACKOFF)
