"""The servers under test, one per process, pinned to the server core.

    python bench/servers.py bare      --port P --cert-dir D   # (a) aiohttp over TLS, allowed: true
    python bench/servers.py kopf-noop --port P --cert-dir D   # (b) Kopf, one no-op validate handler
    python bench/servers.py operator                          # the operator, configured by AP_* vars

All three log like the operator's CLI does in production (``logging.basicConfig`` at INFO) and
silence the same per-request lines the same way the operator does (aiohttp's access log; Kopf's
"kopf.objects" below WARNING, where "Webhook 'validate' succeeded" goes), so the baselines differ
from the operator only in what runs per request, not in how much they log. Packages installed for
the tests only are hidden from all three, as they are absent from the image.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import logging
import pathlib
import re
import ssl
import sys
import tomllib
from typing import Any

from common import HOST, REPO, SERVER_CORE, pin

LOG_FORMAT = "[%(asctime)s] %(name)-28s [%(levelname)-7s] %(message)s"   # the operator CLI's


def cert_files(directory: pathlib.Path) -> tuple[str, str, str]:
    """(certfile, pkeyfile, cafile) as admission_policy's certificates.write_files names them."""
    return str(directory / "tls.crt"), str(directory / "tls.key"), str(directory / "ca.crt")


def serve_bare(port: int, cert_dir: pathlib.Path) -> None:
    """(a): parse the review (the uid must be echoed) and allow it; nothing else."""
    import aiohttp.web

    async def review(request: aiohttp.web.Request) -> aiohttp.web.Response:
        body: Any = await request.json()
        return aiohttp.web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                          "response": {"uid": body["request"]["uid"], "allowed": True}})

    certfile, pkeyfile, _ = cert_files(cert_dir)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, pkeyfile)
    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.post("/{id:.*}", review)])
    aiohttp.web.run_app(app, host=HOST, port=port, ssl_context=context, print=None)


def serve_kopf_noop(port: int, cert_dir: pathlib.Path) -> None:
    """(b): Kopf's own webhook server and admission path, with a handler that does nothing.

    Routed like the operator's ``validate`` handler (every resource and subresource, same id),
    so Kopf does the same resource lookup, cause building and response building per request.
    """
    import kopf

    certfile, pkeyfile, cafile = cert_files(cert_dir)

    @kopf.on.startup()
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.admission.managed = None
        settings.admission.server = kopf.WebhookServer(addr=HOST, port=port, certfile=certfile, pkeyfile=pkeyfile,
                                                       cafile=cafile, file_check_interval=10.0)
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    @kopf.on.validate(kopf.EVERYTHING, id="validate", subresource="*")
    async def validate(**_: Any) -> None:
        pass

    kopf.run(clusterwide=True, standalone=True, liveness_endpoint=None)


def serve_operator() -> None:
    """The operator's production entry point: ``admission-policy run --standalone`` (the console
    script's ``command.main``: the CLI's commands and ``run``)."""
    from admission_policy.command import main
    main(["run", "--standalone"])


def hide_test_only_packages() -> None:
    """Import what the image has: the packages of the project's ``test`` extra are installed in this
    venv for the tests, and some dependencies import them when they can (Kopf imports pykube,
    kubernetes_asyncio imports kubernetes_validate). Hidden, they raise ImportError as in the image."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {_distribution(r) for r in project["dependencies"]}
    test_only = {_distribution(r) for r in project["optional-dependencies"]["test"]} - runtime
    for module, distributions in importlib.metadata.packages_distributions().items():
        if {_distribution(d) for d in distributions} <= test_only and module not in sys.modules:
            sys.modules[module] = None  # type: ignore[assignment]


def _distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def main() -> None:
    hide_test_only_packages()
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("bare", "kopf-noop", "operator"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert-dir", type=pathlib.Path)
    parser.add_argument("--core", type=int, default=SERVER_CORE,
                        help="the core to pin to (bench/e2e.py puts two operator replicas on two cores)")
    args = parser.parse_args()
    pin(args.core)
    if args.kind == "operator":
        serve_operator()   # configures logging itself, as in production
        return
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.kind == "bare":
        serve_bare(args.port, args.cert_dir)
    else:
        serve_kopf_noop(args.port, args.cert_dir)


if __name__ == "__main__":
    main()
