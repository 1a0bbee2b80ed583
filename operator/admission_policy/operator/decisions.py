"""Log lines for admission decisions, so that the log answers "why was my Pod denied?".

Each denial, warning, audit finding and ignored evaluation error is one INFO line naming the
policy, the verdict, the operation, the object (kind, namespace/name), the user and the policy's
message, e.g.::

    AdmissionPolicy deny-privileged: denied CREATE Pod team-a/web by alice: privileged containers ...

Anyone allowed to create Pods can make the webhook deny as fast as the API server calls it, so
these lines are rate-limited per policy: at most ``burst`` per ``window`` seconds, then one line
says how many were suppressed. Every decision (allowed ones too, without limit) is one DEBUG line.
Dry-run requests are logged like the others, marked "(dry run)". No line carries the object
itself: only its identity, and the messages the policy author wrote.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from ..engine import AdmissionRequest, Decision, PolicyOutcome

logger = logging.getLogger(__name__)

MAX_MESSAGE = 512   # characters of a policy's message in one line


@dataclasses.dataclass
class _Window:
    started: float
    logged: int = 0
    suppressed: int = 0


class DecisionLog:
    """The decision lines, rate-limited per policy as the module says; ``run`` reports what
    was suppressed even when no later decision comes to do it."""

    def __init__(self, burst: int = 10, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.window = window
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def record(self, request: AdmissionRequest, decision: Decision, webhook: str) -> None:
        """Called on the hot path, once per request and webhook: cheap when nothing is logged."""
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("Admission %s via %s: %s", describe(request), webhook, _summary(decision))
        if not logger.isEnabledFor(logging.INFO):
            return
        for outcome in decision.outcomes:
            verdict = _verdict(outcome)
            if verdict and self._admit(outcome.policy):
                logger.info("AdmissionPolicy %s: %s %s: %s", outcome.policy, verdict, describe(request),
                            _message(outcome))

    def refused_policy(self, request: AdmissionRequest, message: str) -> None:
        """The policy webhook refused an AdmissionPolicy write (rate-limited as one source)."""
        if logger.isEnabledFor(logging.INFO) and self._admit("(policy webhook)"):
            logger.info("Refused %s: %s", describe(request), _clean(message))

    def flush(self) -> None:
        """Report the suppressed lines of every window that has ended, and forget idle policies."""
        now = self.clock()
        for key, window in list(self._windows.items()):
            if now - window.started >= self.window:
                self._report(key, window)
                del self._windows[key]

    async def run(self) -> None:
        """Flush once per window, so a flood that stops is still counted in the log."""
        while True:
            await asyncio.sleep(self.window)
            self.flush()

    def _admit(self, key: str) -> bool:
        now = self.clock()
        window = self._windows.get(key)
        if window is None or now - window.started >= self.window:
            if window is not None:
                self._report(key, window)
            window = self._windows[key] = _Window(now)
        if window.logged < self.burst:
            window.logged += 1
            return True
        window.suppressed += 1
        return False

    def _report(self, key: str, window: _Window) -> None:
        if window.suppressed:
            logger.info("AdmissionPolicy %s: %d more decision line(s) suppressed in %.0fs "
                        "(at most %d per %.0fs per policy)", key, window.suppressed,
                        self.clock() - window.started, self.burst, self.window)


def describe(request: AdmissionRequest) -> str:
    """``CREATE Pod team-a/web by alice (dry run)``: what was asked, on what, by whom."""
    kind = request.raw.get("kind")
    kind_name = kind.get("kind") if isinstance(kind, dict) else None
    target = f"{request.namespace}/{request.name}" if request.namespace else request.name
    text = f"{request.operation} {kind_name or request.resource} {target or '(unnamed)'}"
    if request.sub_resource:
        text += f" ({request.resource}/{request.sub_resource})"
    user = request.raw.get("userInfo")
    username = user.get("username") if isinstance(user, dict) else None
    text += f" by {username or '(unknown user)'}"
    return _clean(text + (" (dry run)" if request.dry_run else ""))


def _verdict(outcome: PolicyOutcome) -> str:
    """The word for a decision worth an INFO line; "" for an allow or a mutation."""
    result = outcome.result
    if result in ("denied", "warned", "audited"):
        return result
    if outcome.errors:
        return "could not evaluate (ignored, failurePolicy Ignore)"
    return ""


def _message(outcome: PolicyOutcome) -> str:
    return _clean("; ".join(outcome.failures or outcome.errors))


def _summary(decision: Decision) -> str:
    verdict = "allowed" if decision.allowed else f"denied ({decision.code})"
    if not decision.outcomes:
        return f"{verdict}, no policy matched"
    return f"{verdict}: " + ", ".join(f"{o.policy} {o.result}" for o in decision.outcomes)


def _clean(text: Any) -> str:
    """One line, bounded: a message built from the object cannot forge or flood log lines."""
    line = str(text).replace("\r", "\\r").replace("\n", "\\n")
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE] + "…"
