"""
Fixtures to run the real Kopf operator against kmock's emulator (the harness is in emulator.py).

    async def test_x(emulator, run_operator):
        async with run_operator(registry=my_registry) as op:   # or module='admission_policy.…'
            await emulator.create(ADMISSION_POLICIES, {...})
            await op.wait_for(lambda: (emulator.peek(ADMISSION_POLICIES, 'p') or {}).get('status'))

The operator runs as a task in the test's own event loop (``kopf.operator(...)`` with a stop
flag), cluster-wide, standalone (no peering), without managed webhook configurations,
with events posted. Leaving the ``async with`` stops it and re-raises its failure, if any.
"""
import contextlib
import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import emulator as harness
import pytest
from emulator import Emulator, RunningOperator
from operator_env import Webhook, operator_environment, serving_webhook


@pytest.fixture
async def emulator(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Emulator]:
    """A fresh emulator per test; kubeconfig-reading clients are pointed at it meanwhile."""
    async with Emulator() as emu:
        monkeypatch.setenv('KUBECONFIG', str(emu.kubeconfig))
        with contextlib.suppress(ImportError):
            # kubernetes_asyncio reads $KUBECONFIG once, at import: patch its default too.
            from kubernetes_asyncio.config import kube_config
            monkeypatch.setattr(kube_config, 'KUBE_CONFIG_DEFAULT_LOCATION', str(emu.kubeconfig))
        yield emu


@pytest.fixture
def run_operator(emulator: Emulator) -> Callable[..., contextlib.AbstractAsyncContextManager[RunningOperator]]:
    """
    ``run_operator(registry=None, module=None, settings=None, memo=None, namespaces=(),
    startup_timeout=10, stop_timeout=10)`` → async context manager yielding a ``RunningOperator``.
    See ``emulator.run_operator``.
    """
    def runner(**kwargs: Any) -> contextlib.AbstractAsyncContextManager[RunningOperator]:
        return harness.run_operator(emulator, **kwargs)
    return runner


@pytest.fixture
def serving(emulator: Emulator, run_operator: Any, monkeypatch: pytest.MonkeyPatch,
            tmp_path: pathlib.Path) -> Callable[[], contextlib.AbstractAsyncContextManager[Webhook]]:
    """``serving()`` → async context manager: the running operator with example policies loaded
    (``operator_env.serving_webhook``), entered in the test's own task (pytest-asyncio tears
    fixtures down in another task, which Kopf's shutdown does not survive). Set ``AP_*``
    variables with monkeypatch before entering it."""
    env = operator_environment(monkeypatch, tmp_path / "certs")
    return lambda: serving_webhook(emulator, run_operator, env)
