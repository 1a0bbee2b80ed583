"""Outages the emulator can be made to have, through kmock's reactions: a refusing API server and a
stalled connection, switched off again by the test."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import kmock
from emulator import Emulator


class Outage:
    """While on, the emulator answers the requests it is installed for as ``react`` says; once off,
    as usual (the reaction steps aside for good: kmock drops a reaction that declines a request)."""

    def __init__(self, react: Callable[[], Any]) -> None:
        self.on = True
        self._react = react

    def __call__(self) -> Any:
        return self._react() if self.on else NotImplemented


def refuse(status: int, reason: str) -> Callable[[], Any]:
    def react() -> Any:
        raise kmock.KubernetesError(status=status, reason=reason, message="refused by the test")
    return react


@contextlib.contextmanager
def stalled(emulator: Emulator, resource: str) -> Iterator[Outage]:
    """Lists and watches of ``resource`` that answer 200 and then send nothing, never ending: a
    half-open connection, as a dead load balancer or a partitioned node leaves it."""
    released = asyncio.Event()

    async def silent() -> Any:
        yield b""          # the headers go out; the body never comes
        await released.wait()

    outage = Outage(silent)
    for action in (kmock.action.LIST, kmock.action.WATCH):
        emulator.kmock[action, kmock.resource(resource)] << outage
    try:
        yield outage
    finally:
        released.set()
