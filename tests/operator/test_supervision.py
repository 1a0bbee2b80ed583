"""Background tasks that die: restarted with backoff; left dead (and named by the probes) when
they keep dying; stopped, not restarted, at shutdown (docs/design.md, "Background tasks")."""
from __future__ import annotations

import asyncio
import logging
import pathlib
from typing import Any

import aiohttp
import pytest
from emulator import Emulator, wait_for
from operator_env import operator_environment, operator_running

from admission_policy.operator import reconcile, state, supervision, watcher
from admission_policy.operator.supervision import Supervisor


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "BACKOFF", 0.0)


class Boom(RuntimeError):
    pass


# --- the supervisor alone ---------------------------------------------------------------------------------------

async def done(tasks: Supervisor, name: str) -> None:
    task = tasks.supervised[name].task
    assert task is not None
    await asyncio.wait_for(task, timeout=5)


async def test_a_task_that_raises_is_restarted() -> None:
    calls, running = 0, asyncio.Event()

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Boom("first run")
        running.set()
        await asyncio.Event().wait()

    tasks = Supervisor()
    tasks.spawn("flaky", flaky)
    await asyncio.wait_for(running.wait(), timeout=5)
    assert list(tasks.stats()) == [("flaky", 1, False)]
    assert tasks.given_up(essential=True) == ""
    await tasks.stop()


async def test_a_task_that_keeps_dying_is_left_dead_and_named(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise Boom("always")

    tasks = Supervisor()
    tasks.spawn("broken", broken)
    tasks.spawn("side", broken, essential=False)
    await wait_for(lambda: all(given_up for _, _, given_up in tasks.stats()), timeout=5)
    assert calls == 2 * supervision.DEATHS   # and no more
    assert tasks.given_up(essential=True).startswith("background task 'broken' stopped: died 8 times within 900s")
    assert "Boom('always')" in tasks.given_up(essential=True)
    assert tasks.given_up(essential=False).startswith("background task 'side' stopped")
    assert "neither ready nor live" in caplog.text
    await tasks.stop()


async def test_deaths_further_apart_than_the_window_are_restarted_for_ever() -> None:
    clock = 0.0
    calls = 0

    async def dies_now_and_then() -> None:
        nonlocal calls, clock
        calls += 1
        clock += supervision.WINDOW / 2   # at most two deaths within any window
        if calls <= 3 * supervision.DEATHS:
            raise Boom(f"death {calls}")

    tasks = Supervisor(clock=lambda: clock)
    tasks.spawn("sometimes", dies_now_and_then)
    await done(tasks, "sometimes")
    assert list(tasks.stats()) == [("sometimes", 3 * supervision.DEATHS, False)]


def test_the_backoff_doubles_from_one_second_up_to_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "BACKOFF", 1.0)
    assert [supervision.backoff(deaths) for deaths in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


async def test_shutdown_cancels_without_a_restart(caplog: pytest.LogCaptureFixture) -> None:
    calls, running, cancelled = 0, asyncio.Event(), asyncio.Event()

    async def endless() -> None:
        nonlocal calls
        calls += 1
        running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    tasks = Supervisor()
    tasks.spawn("endless", endless)
    await asyncio.wait_for(running.wait(), timeout=5)
    await tasks.stop()
    assert cancelled.is_set() and calls == 1
    assert list(tasks.stats()) == [("endless", 0, False)]
    assert not [r for r in caplog.records if r.name == supervision.__name__]


async def test_a_task_that_returns_has_done_its_job() -> None:
    calls = 0

    async def once() -> None:
        nonlocal calls
        calls += 1

    tasks = Supervisor()
    tasks.spawn("once", once)
    await done(tasks, "once")
    assert calls == 1 and list(tasks.stats()) == [("once", 0, False)]


# --- in the operator ---------------------------------------------------------------------------------------------

@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> dict[str, str]:
    return operator_environment(monkeypatch, tmp_path / "certs")


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def test_the_namespace_watcher_dying_once_is_restarted_and_the_replica_stays_ready(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real, calls = watcher.watch_namespaces, 0

    async def first_run_fails(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Boom("a bug")
        await real(*args)

    monkeypatch.setattr(watcher, "watch_namespaces", first_run_fails)
    health, metrics = f"http://127.0.0.1:{env['AP_HEALTH_PORT']}", f"http://127.0.0.1:{env['AP_METRICS_PORT']}"
    with caplog.at_level(logging.INFO):
        async with operator_running(run_operator) as op:
            await op.wait_for(lambda: state.operator().store.readiness.namespaces_loaded.is_set(), timeout=20)
            assert await op.wait_for(lambda: get_when(f"{health}/readyz", 200), timeout=20) == (200, "ready")
            assert await get(f"{health}/healthz") == (200, "ok")
            _, text = await get(f"{metrics}/metrics")
            assert 'admission_policy_task_restarts_total{task="namespace watcher"} 1.0' in text
            assert 'admission_policy_task_stopped{task="namespace watcher"} 0.0' in text
    died = [r.getMessage() for r in caplog.records if r.name == supervision.__name__]
    assert died == ["Background task 'namespace watcher' died, restarting it in 0s: Boom('a bug')"]   # not at exit


@pytest.mark.parametrize(("module", "name", "task", "status", "readiness"), [
    # What the answers depend on: a fresh process is the cure, so both probes fail.
    (watcher, "watch_namespaces", "namespace watcher", 503, "not ready:"),
    # Failing readiness for a task the answers do not depend on would take the webhook away.
    (reconcile, "follow_inputs", "inputs status", 200, "ready;"),
])
async def test_a_task_dying_for_good_is_named_by_the_probes_failing_them_if_answers_depend_on_it(
        emulator: Emulator, run_operator: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        module: Any, name: str, task: str, status: int, readiness: str) -> None:
    async def always_fails(*_: Any) -> None:
        raise Boom("a bug")

    monkeypatch.setattr(module, name, always_fails)
    health = f"http://127.0.0.1:{env['AP_HEALTH_PORT']}"
    async with operator_running(run_operator) as op:
        _, text = await op.wait_for(lambda: get_when(f"{health}/readyz", status, task), timeout=20)
        assert text.startswith(f"{readiness} background task '{task}' stopped: died 8 times"), text
        liveness, text = await get(f"{health}/healthz")
        named = f"background task '{task}' stopped" in text
        assert (liveness, named) == ((503, True) if status == 503 else (200, False))


async def get_when(url: str, status: int, text: str = "") -> tuple[int, str] | None:
    answer = await get(url)
    return answer if answer[0] == status and text in answer[1] else None
