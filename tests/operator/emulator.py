"""
Run the real Kopf operator against kmock's ``KubernetesEmulator`` — no cluster needed.

kmock 0.8 (``kmock/_internal/k8s.py``) stores objects in memory and serves discovery, list,
watch, fetch, create, merge/JSON patch and delete. ``ShimmedEmulator`` below adds only what
Kopf relies on and kmock lacks (docs/design.md, "Testing the operator without a cluster"):

* stamps ``metadata.uid``/``creationTimestamp``/``resourceVersion``/``generation`` and fills
  ``metadata.name`` from ``generateName`` (Kopf posts events with ``generateName``);
  ``resourceVersion`` is bumped on every write, ``generation`` only when something other
  than ``metadata``/``status`` changes (what ``status.observedGeneration`` is compared with);
* answers a failed JSON-patch ``test`` op with 422 instead of 500 (Kopf guards its finalizer
  patches with ``test /metadata/resourceVersion`` and expects 422 on a conflict,
  ``kopf/_cogs/clients/patching.py``);
* honours the ``status`` subresource: ``.../status`` writes change only ``status``, writes to
  the main resource leave ``status`` alone; server-owned metadata cannot be overwritten;
  a no-op patch changes nothing and emits no event (as in Kubernetes);
* PUT (replace) with the ``resourceVersion`` precondition (409 on a stale one);
* list answers carry the current ``resourceVersion``; a watch with ``resourceVersion=N``
  replays only the events after N (kmock replays every object as ADDED and ignores it), or
  an ERROR event with 410 Gone when N is older than a ``compact()``; watches honour
  ``timeoutSeconds``;
* discovery: the resources are declared by hand (builtins from kmock's bundled K3s list),
  the project's CRD from ``crds/admissionpolicy.yaml``, and the CRD object is stored too;
* Namespace objects: kmock parses ``/api/v1/namespaces/X`` as "in namespace X" and cannot
  serve them at all; they are routed under a placeholder resource and restored.

Not emulated (by design): schema validation and defaulting from the CRD, label/field
selectors, garbage collection of owned objects, admission webhooks (test the webhook server
directly over HTTPS), real authentication.
"""
from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import copy
import dataclasses
import datetime
import importlib
import importlib.util
import inspect
import os
import pathlib
import random
import re
import string
import sys
import tempfile
import types
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import Any, TypeVar

import aiohttp
import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import kopf
import yaml
from kmock._internal import rendering  # kmock 0.8 does not re-export its Request type

# kopf.operator(vault=...) is public, but kopf 1.45 does not re-export the Vault class.
from kopf._cogs.structs.credentials import Vault

T = TypeVar('T')

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / 'crds'

ADMISSION_POLICIES = 'policy-operator.dev/v1alpha1/admissionpolicies'
NAMESPACES = 'v1/namespaces'
SECRETS = 'v1/secrets'
EVENTS = 'v1/events'
CONFIGMAPS = 'v1/configmaps'
PODS = 'v1/pods'
DEPLOYMENTS = 'apps/v1/deployments'
LEASES = 'coordination.k8s.io/v1/leases'
VALIDATING_WEBHOOK_CONFIGURATIONS = 'admissionregistration.k8s.io/v1/validatingwebhookconfigurations'
MUTATING_WEBHOOK_CONFIGURATIONS = 'admissionregistration.k8s.io/v1/mutatingwebhookconfigurations'
CRDS = 'apiextensions.k8s.io/v1/customresourcedefinitions'
CLUSTER_KOPF_PEERINGS = 'kopf.dev/v1/clusterkopfpeerings'
KOPF_PEERINGS = 'kopf.dev/v1/kopfpeerings'

BUILTIN_RESOURCES = [
    NAMESPACES, SECRETS, EVENTS, CONFIGMAPS, PODS, DEPLOYMENTS, LEASES,
    VALIDATING_WEBHOOK_CONFIGURATIONS, MUTATING_WEBHOOK_CONFIGURATIONS, CRDS,
]

# Used only if crds/ holds no CRD; mirrors crds/admissionpolicy.yaml in short.
FALLBACK_CRD: dict[str, Any] = {
    'apiVersion': 'apiextensions.k8s.io/v1',
    'kind': 'CustomResourceDefinition',
    'metadata': {'name': 'admissionpolicies.policy-operator.dev'},
    'spec': {
        'group': 'policy-operator.dev',
        'scope': 'Cluster',
        'names': {'kind': 'AdmissionPolicy', 'listKind': 'AdmissionPolicyList',
                  'plural': 'admissionpolicies', 'singular': 'admissionpolicy',
                  'shortNames': ['ap', 'admpol']},
        'versions': [{'name': 'v1alpha1', 'served': True, 'storage': True,
                      'subresources': {'status': {}},
                      'schema': {'openAPIV3Schema': {'type': 'object',
                                                     'x-kubernetes-preserve-unknown-fields': True}}}],
    },
}

KOPF_PEERING_CRDS: list[tuple[str, str, bool]] = [
    (CLUSTER_KOPF_PEERINGS, 'ClusterKopfPeering', False),
    (KOPF_PEERINGS, 'KopfPeering', True),
]

VERBS = {'create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch'}
SERVER_OWNED_METADATA = ('uid', 'creationTimestamp', 'deletionTimestamp', 'generation',
                         'resourceVersion', 'name', 'namespace')


class EmulatorAPIError(Exception):
    """A non-2xx answer from the emulator to a test-side request."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get('message') if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body


# --------------------------------------------------------------------------------------------
# The shim
# --------------------------------------------------------------------------------------------

def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic-merge patches: no list merging)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _essence(body: Mapping[str, Any]) -> dict[str, Any]:
    return {key: val for key, val in body.items() if key not in {'metadata', 'status'}}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


_NS_PLACEHOLDER = 'namespaces--kmock-shim'
_NAMESPACE_PATH = re.compile(r'/api/v1/namespaces(?P<rest>/[^/]+(?:/(?:status|finalize))?)?')


def _rv_of(event: Mapping[str, Any]) -> int:
    try:
        return int(event['object']['metadata']['resourceVersion'])
    except (KeyError, TypeError, ValueError):
        return 0


@attrs.define(kw_only=True)
class ShimmedEmulator(kmock.KubernetesEmulator):
    """
    ``kmock.KubernetesEmulator`` plus the Kubernetes semantics Kopf relies on (see above).

    Writes (POST/PATCH/PUT/DELETE on resources) are applied here instead of in kmock's
    ``_handle`` (which stores bodies verbatim and turns a failed JSON-patch test into a 500);
    the stored state and history (``.objects``), the recorded requests (``list(emulator.kmock)``),
    the event buses and the serving of answers (including DSL reactions a test adds, e.g.
    ``emulator.kmock['patch', kmock.resource(...)] << 500``) remain kmock's own.
    """

    _rv: int = attrs.field(default=1000, init=False)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _log: dict[kmock.resource, list[dict[str, Any]]] = attrs.field(
        factory=lambda: collections.defaultdict(list), init=False)
    _created: dict[int, tuple[kmock.resource, str | None, str]] = attrs.field(factory=dict, init=False)
    _compacted: dict[kmock.resource, int] = attrs.field(factory=dict, init=False)

    def compact(self, resource: kmock.resource) -> None:
        """Forget the history so far, as etcd compaction does: a watch from an older
        ``resourceVersion`` gets an ERROR event with a 410 Gone status (``Expired``)."""
        self._compacted[resource] = self._rv

    def next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    @property
    def current_rv(self) -> str:
        return str(self._rv)

    def stamp_new(self, resource: kmock.resource, body: Mapping[str, Any],
                  namespace: str | None = None) -> dict[str, Any]:
        """Fill server-side fields of a new object, as the API server does on creation."""
        result: dict[str, Any] = copy.deepcopy(dict(body))
        meta = result.setdefault('metadata', {})
        # Not .get(): kmock's ResourcesArray auto-creates (and so declares) missing keys on [].
        info = self.resources[resource] if resource in self.resources else None  # noqa: SIM401
        namespaced = info.namespaced if info is not None else namespace is not None
        if namespaced:
            meta['namespace'] = namespace or meta.get('namespace') or 'default'
        else:
            meta.pop('namespace', None)
        if not meta.get('name'):
            if not meta.get('generateName'):
                raise kmock.KubernetesError(status=422, reason='Invalid',
                                            message='metadata.name or generateName is required')
            suffix = ''.join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta['name'] = meta['generateName'] + suffix
        group_version = f'{resource.group}/{resource.version}' if resource.group else resource.version
        result.setdefault('apiVersion', group_version)
        if info is not None and info.kind:
            result.setdefault('kind', info.kind)
        for key in ('deletionTimestamp', 'deletionGracePeriodSeconds'):
            meta.pop(key, None)
        meta['uid'] = str(uuid.uuid4())
        meta['creationTimestamp'] = _now()
        meta['resourceVersion'] = self.next_rv()
        meta['generation'] = 1
        return result

    def put_object(self, resource: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store an object directly (no HTTP, no watch event): for preloading before a run."""
        res = kmock.resource(resource)
        stamped = self.stamp_new(res, body, body.get('metadata', {}).get('namespace'))
        meta = stamped['metadata']
        self.objects[res, meta.get('namespace'), meta['name']] = stamped
        return copy.deepcopy(stamped)

    async def _emit(self, resource: kmock.resource, type_: str, body: Mapping[str, Any]) -> None:
        event = {'type': type_, 'object': copy.deepcopy(dict(body))}
        self._log[resource].append(event)
        await self._buses[resource].put(event)

    # --- namespaces ----------------------------------------------------------------------------
    # kmock's URL parser reads /api/v1/namespaces/X as "namespace X" (and crashes on the bare
    # collection), so Namespace objects cannot be served. Route them under a placeholder plural
    # that kmock parses normally, then restore the real resource before anything else sees it.

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # The API server parses booleans like Go's ParseBool ("True" from kubernetes_asyncio);
        # kmock only recognises a watch by the exact string "true".
        if raw_request.query.get('watch', '').lower() in ('1', 't', 'true') and raw_request.query['watch'] != 'true':
            query = {**raw_request.query, 'watch': 'true'}
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_query(query))
        match = _NAMESPACE_PATH.fullmatch(raw_request.path)
        if match is not None:
            path = f"/api/v1/{_NS_PLACEHOLDER}{match['rest'] or ''}"
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_path(path).with_query(raw_request.query))
        return await super().__call__(raw_request)

    def _restore_namespaces(self, request: rendering.Request) -> rendering.Request:
        if request.resource is None or request.resource.plural != _NS_PLACEHOLDER:
            return request
        path = request.url.path.replace(f'/{_NS_PLACEHOLDER}', '/namespaces', 1)
        fixed = attrs.evolve(request, resource=kmock.resource(NAMESPACES),
                             url=request.url.with_path(path).with_query(request.url.query))
        # kmock matches reactions to requests by identity among its recorded requests.
        self._requests[:] = [fixed if r is request else r for r in self._requests]
        return fixed

    # --- writes ------------------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        request = self._restore_namespaces(request)
        is_put = request.method == kmock.method.PUT and request.name is not None
        is_write = request.action in {kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE}
        if request.resource is None or not (is_write or is_put):
            return await super()._handle(request)
        async with self._write_lock:  # serialise read-modify-write; never held by reads/watches
            async with self._lock:
                answer = await self._write(request, is_put=is_put)
            if answer is not None:
                return answer
            # Skip KubernetesEmulator._handle (its own write path); serve as kmock does.
            return await kmock.KubernetesScaffold._handle(self, request)

    async def _write(self, request: rendering.Request, *, is_put: bool) -> aiohttp.web.StreamResponse | None:
        resource = request.resource
        assert resource is not None

        if request.action == kmock.action.CREATE:
            if not isinstance(request.data, dict):
                raise kmock.KubernetesError(status=400, reason='BadRequest', message='expected an object')
            body = self.stamp_new(resource, request.data, request.namespace)
            key = (resource, body['metadata'].get('namespace'), body['metadata']['name'])
            if key in self.objects and not self.objects[key].deleted:
                raise kmock.KubernetesError(status=409, reason='AlreadyExists',
                                            message=f"{resource.plural} {key[2]!r} already exists")
            if key in self.objects:
                self.objects[key].create(body)
            else:
                self.objects[key] = body
            self._created[id(request)] = key
            await self._emit(resource, 'ADDED', body)
            return None

        if request.name is None:
            raise kmock.KubernetesObjectNotFoundError()
        key = (resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        obj = self.objects[key]
        old: dict[str, Any] = copy.deepcopy(obj.raw)
        old.setdefault('metadata', {})

        if request.action == kmock.action.DELETE:
            if old['metadata'].get('deletionTimestamp'):
                return None  # already being deleted: answer with the current state
            if old['metadata'].get('finalizers'):
                deleting = copy.deepcopy(old)
                deleting['metadata'].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0,
                                            resourceVersion=self.next_rv())
                obj.history.append(deleting)
                await self._emit(resource, 'MODIFIED', deleting)
            else:
                await self._delete(resource, obj)
            return None

        new: dict[str, Any]
        if is_put:
            if not isinstance(request.data, dict):
                raise kmock.KubernetesError(status=400, reason='BadRequest', message='expected an object')
            new = copy.deepcopy(request.data)
            wanted_rv = new.get('metadata', {}).get('resourceVersion')
            if wanted_rv and wanted_rv != old['metadata'].get('resourceVersion'):
                raise kmock.KubernetesError(
                    status=409, reason='Conflict',
                    message='the object has been modified; please apply your changes to the latest version')
        elif isinstance(request.data, list):
            try:
                new = jsonpatch.apply_patch(old, request.data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                # JsonPatchTestFailed included: Kubernetes answers 422, Kopf expects exactly that.
                raise kmock.KubernetesError(status=422, reason='Invalid', message=str(e)) from e
        elif isinstance(request.data, dict):
            new = _merge_patch(old, request.data)
        else:
            raise kmock.KubernetesError(status=400, reason='BadRequest', message='unsupported patch body')
        if not isinstance(new, dict):
            raise kmock.KubernetesError(status=422, reason='Invalid', message='the result is not an object')

        # Subresource semantics: /status changes only status; the main resource never changes it.
        # Not .get(): kmock's ResourcesArray auto-creates (and so declares) missing keys on [].
        info = self.resources[resource] if resource in self.resources else None  # noqa: SIM401
        if request.subresource == 'status':
            new = {k: v for k, v in old.items() if k != 'status'} | (
                {'status': new['status']} if new.get('status') is not None else {})
        elif info is not None and 'status' in info.subresources:
            new = {k: v for k, v in new.items() if k != 'status'} | (
                {'status': old['status']} if 'status' in old else {})

        meta = new.setdefault('metadata', {})
        for field in SERVER_OWNED_METADATA:
            if field in old['metadata']:
                meta[field] = old['metadata'][field]
            else:
                meta.pop(field, None)
        if new == old:  # a no-op: no new resourceVersion, no watch event (as in Kubernetes)
            return aiohttp.web.json_response(old)
        if _essence(new) != _essence(old):
            meta['generation'] = int(old['metadata'].get('generation', 1)) + 1
        meta['resourceVersion'] = self.next_rv()
        obj.history.append(new)
        await self._emit(resource, 'MODIFIED', new)
        if meta.get('deletionTimestamp') and not meta.get('finalizers'):
            await self._delete(resource, obj)  # the last finalizer is gone
        # kmock serves no PUT; for PATCH, kmock's _serve_update answers with the last state.
        return aiohttp.web.json_response(new) if is_put else None

    async def _delete(self, resource: kmock.resource, obj: kmock.Object) -> None:
        gone = copy.deepcopy(obj.raw)
        gone.setdefault('metadata', {})['resourceVersion'] = self.next_rv()  # deletion is a write
        obj.delete()  # soft: kmock's _serve_update/_serve_delete still answer with obj.last
        await self._emit(resource, 'DELETED', gone)

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        # kmock finds the created object by the request's name: none with generateName.
        key = self._created.pop(id(request), None)
        if key is None:
            return await super()._serve_create(request)
        return self.objects[key].last.raw

    # --- reads -------------------------------------------------------------------------------

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        payload = await super()._serve_list(request)
        assert isinstance(payload, dict)
        payload['metadata'] = {'resourceVersion': self.current_rv}
        return payload

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        resource = request.resource
        assert resource is not None
        if resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()

        def matches(event: Mapping[str, Any]) -> bool:
            meta = event.get('object', {}).get('metadata', {})
            return ((request.namespace is None or meta.get('namespace') == request.namespace) and
                    (request.name is None or meta.get('name') == request.name))

        since_str = request.params.get('resourceVersion') or ''
        since = int(since_str) if since_str.isdigit() and since_str != '0' else None
        timeout = request.params.get('timeoutSeconds')

        if since is not None and since < self._compacted.get(resource, 0):
            yield b''
            yield {'type': 'ERROR', 'object': {
                'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'code': 410,
                'reason': 'Expired', 'message': f'too old resource version: {since} ({self.current_rv})'}}
            return

        bus = self._buses[resource]
        async with self._lock:  # writers emit under this lock: the snapshot and the mark agree
            marker = await bus.mark()
            if since is None:
                backlog = [{'type': 'ADDED', 'object': copy.deepcopy(obj.raw)}
                           for (res, _, _), obj in self.objects.items()
                           if res == resource and not obj.deleted]
            else:
                backlog = [event for event in self._log[resource] if _rv_of(event) > since]
        try:
            yield b''  # send the headers now, even if there is nothing to stream yet
            for event in backlog:
                if matches(event):
                    yield event
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(float(timeout) if timeout else None):
                    async for event in bus.stream(since=marker):
                        if matches(event):
                            yield event
        finally:
            with contextlib.suppress(ValueError):
                await bus.unmark(marker)

# --------------------------------------------------------------------------------------------
# The test-facing wrapper: lifecycle, declarations, client helpers.
# --------------------------------------------------------------------------------------------

def load_crds(directory: pathlib.Path = CRD_DIR) -> list[dict[str, Any]]:
    """The project's CRDs, every ``crds/*.yaml`` (or the hand-declared fallback)."""
    docs = [doc for path in sorted(directory.glob('*.yaml')) for doc in yaml.safe_load_all(path.read_text()) if doc]
    crds = [doc for doc in docs if doc.get('kind') == 'CustomResourceDefinition']
    return crds or [copy.deepcopy(FALLBACK_CRD)]


def _peering_crd(resource: str, kind: str, namespaced: bool) -> dict[str, Any]:
    group, version, plural = resource.split('/')
    return {
        'apiVersion': 'apiextensions.k8s.io/v1', 'kind': 'CustomResourceDefinition',
        'metadata': {'name': f'{plural}.{group}'},
        'spec': {'group': group, 'scope': 'Namespaced' if namespaced else 'Cluster',
                 'names': {'kind': kind, 'plural': plural, 'singular': kind.lower()},
                 'versions': [{'name': version, 'served': True, 'storage': True,
                               'schema': {'openAPIV3Schema': {
                                   'type': 'object', 'x-kubernetes-preserve-unknown-fields': True}}}]},
    }


async def _maybe_await(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


async def wait_for(
        predicate: Callable[[], Any],
        *,
        timeout: float = 10.0,
        interval: float = 0.05,
        message: str | None = None,
) -> Any:
    """
    Poll ``predicate`` (sync or async) until it returns a truthy value; return that value.

    A predicate may also ``assert``: an ``AssertionError`` counts as "not yet" and is chained
    to the ``TimeoutError`` raised at the deadline (which also shows the last returned value).
    Other exceptions propagate at once.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while True:
        try:
            last = await _maybe_await(predicate())
            if last:
                return last
            error: BaseException | None = None
        except AssertionError as e:
            error = e
        if loop.time() >= deadline:
            text = message or getattr(predicate, '__name__', 'condition')
            raise TimeoutError(f"{text} not met in {timeout}s; last value: {last!r}") from error
        await asyncio.sleep(interval)


class Emulator:
    """
    A started ``ShimmedEmulator`` on 127.0.0.1 (random port) with the project's resources declared.

    ``url`` is the API base URL; ``kmock`` is the kmock handler (its DSL, ``.objects``,
    ``.resources``, recorded requests as ``list(emulator.kmock)``); ``kubeconfig`` is a kubeconfig file
    for clients that load one. Resources are written as ``'group/version/plural'``
    (``'v1/pods'`` for the core group), or with the constants of this module.
    """

    def __init__(self) -> None:
        self.kmock = ShimmedEmulator()
        self._server: kmock.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._stack = contextlib.AsyncExitStack()
        self.crds: list[dict[str, Any]] = []
        self._declare()

    # --- declarations ----------------------------------------------------------------------

    def _declare(self) -> None:
        bundled = kmock.ResourcesArray()
        with warnings.catch_warnings():  # kmock 0.8 uses the deprecated importlib.resources.read_binary
            warnings.simplefilter('ignore', DeprecationWarning)
            bundled.load_bundled()  # kmock's K3s builtins: exact kinds, verbs, subresources
        for name in BUILTIN_RESOURCES:
            self.kmock.resources[name] = copy.deepcopy(bundled[name])
        self.crds = load_crds() + [_peering_crd(*args) for args in KOPF_PEERING_CRDS]
        for crd in self.crds:
            self.declare_crd(crd, store=True)

    def declare_crd(self, crd: Mapping[str, Any], *, store: bool = True) -> None:
        """Serve a CRD's resources in discovery (and store the CRD object itself)."""
        spec = crd['spec']
        names = spec['names']
        for version in spec['versions']:
            if not version.get('served', True):
                continue
            self.kmock.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names['kind'],
                singular=names.get('singular') or names['kind'].lower(),
                namespaced=spec.get('scope', 'Namespaced') == 'Namespaced',
                verbs=VERBS,
                shortnames=names.get('shortNames', []),
                categories=names.get('categories', []),
                subresources=list(version.get('subresources', {}) or {}),
            )
        if store:
            self.kmock.put_object(CRDS, crd)

    # --- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Emulator:
        await self._stack.__aenter__()
        try:
            await self._stack.enter_async_context(self.kmock)
            self._server = await self._stack.enter_async_context(kmock.Server(self.kmock))
            # No keep-alive: Kopf treats tasks born after its start as its own "hung" tasks at exit,
            # and idle server-side connection tasks would delay its shutdown by 5 s.
            self._session = await self._stack.enter_async_context(aiohttp.ClientSession(
                base_url=self.url, connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=30)))
            tmpdir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix='kmock-'))
            self.kubeconfig = pathlib.Path(tmpdir) / 'kubeconfig'
            self.kubeconfig.write_text(yaml.safe_dump({
                'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'emulator',
                'clusters': [{'name': 'emulator', 'cluster': {'server': self.url}}],
                'users': [{'name': 'emulator', 'user': {'token': 'emulator'}}],
                'contexts': [{'name': 'emulator', 'context': {
                    'cluster': 'emulator', 'user': 'emulator', 'namespace': 'default'}}],
            }))
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stack.__aexit__(*exc)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("The emulator is not started.")
        return str(self._server.url).rstrip('/')

    # --- URLs --------------------------------------------------------------------------------

    def _info(self, resource: str) -> kmock.ResourceInfo:
        res = kmock.resource(resource)
        if res not in self.kmock.resources:
            raise KeyError(f"Resource {resource!r} is not declared in the emulator.")
        return self.kmock.resources[res]

    def path(self, resource: str, name: str | None = None, *, namespace: str | None = None,
             subresource: str | None = None) -> str:
        res = kmock.resource(resource)
        info = self._info(resource)
        base = f'/api/{res.version}' if not res.group else f'/apis/{res.group}/{res.version}'
        if info.namespaced:
            if namespace is None and name is not None:
                raise ValueError(f"{resource} is namespaced: pass namespace=")
            if namespace is not None:
                base += f'/namespaces/{namespace}'
        base += f'/{res.plural}'
        if name is not None:
            base += f'/{name}'
            if subresource:
                base += f'/{subresource}'
        return base

    # --- client helpers ----------------------------------------------------------------------

    async def request(self, method: str, path: str, *, json: Any = None,
                      headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """A raw request to the emulator; returns (status, parsed JSON or text)."""
        assert self._session is not None, "The emulator is not started."
        async with self._session.request(method, path, json=json, headers=dict(headers or {})) as resp:
            text = await resp.text()
            try:
                body: Any = await resp.json(content_type=None) if text else None
            except ValueError:
                body = text
            return resp.status, body

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        status, body = await self.request(method, path, **kwargs)
        if status >= 400:
            raise EmulatorAPIError(status, body)
        return body

    async def create(self, resource: str, body: Mapping[str, Any], *,
                     namespace: str | None = None) -> dict[str, Any]:
        if self._info(resource).namespaced:
            namespace = namespace or body.get('metadata', {}).get('namespace') or 'default'
        result: dict[str, Any] = await self._call('POST', self.path(resource, namespace=namespace), json=body)
        return result

    async def get(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or ``None`` if it does not exist."""
        return await self._call_or_none('GET', self.path(resource, name, namespace=namespace))

    async def list(self, resource: str, *, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        body = await self._call('GET', self.path(resource, namespace=namespace))
        items: builtins.list[dict[str, Any]] = body.get('items', [])
        return items

    async def patch(self, resource: str, name: str, patch: Mapping[str, Any] | builtins.list[dict[str, Any]], *,
                    namespace: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        """A dict is sent as a JSON merge patch, a list as a JSON patch."""
        content_type = 'application/json-patch+json' if isinstance(patch, list) else 'application/merge-patch+json'
        result: dict[str, Any] = await self._call(
            'PATCH', self.path(resource, name, namespace=namespace, subresource=subresource),
            json=patch, headers={'Content-Type': content_type})
        return result

    async def replace(self, resource: str, name: str, body: Mapping[str, Any], *,
                      namespace: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            'PUT', self.path(resource, name, namespace=namespace, subresource=subresource), json=body)
        return result

    async def delete(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """Request deletion; returns the last state (with deletionTimestamp if finalizers block it)."""
        return await self._call_or_none('DELETE', self.path(resource, name, namespace=namespace))

    async def _call_or_none(self, method: str, path: str) -> dict[str, Any] | None:
        """Like ``_call``, but ``None`` for a 404."""
        status, body = await self.request(method, path)
        if status == 404:
            return None
        if status >= 400:
            raise EmulatorAPIError(status, body)
        result: dict[str, Any] = body
        return result

    def compact(self, resource: str) -> None:
        """Watches resuming from before now get 410 Gone (see ``ShimmedEmulator.compact``)."""
        self.kmock.compact(kmock.resource(resource))

    def peek(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object without HTTP (a deep copy), or ``None`` if absent/deleted."""
        key = (kmock.resource(resource), namespace, name)
        if key not in self.kmock.objects or self.kmock.objects[key].deleted:
            return None
        return copy.deepcopy(self.kmock.objects[key].raw)

    def is_watched(self, resource: str, *, namespace: str | None = None) -> bool:
        """Whether a watch request for the resource (in that namespace, or cluster-wide) arrived.

        Events written after that are delivered to the watcher even if it is still connecting.
        """
        res = kmock.resource(resource)
        return any(r.action == kmock.action.WATCH and r.resource == res and r.namespace == namespace
                   for r in self.kmock)

    def events_for(self, name: str, *, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """Stored core/v1 events whose ``involvedObject.name`` is ``name``."""
        res = kmock.resource(EVENTS)
        return [copy.deepcopy(obj.raw) for (r, _, _), obj in self.kmock.objects.items()
                if r == res and not obj.deleted
                and obj.raw.get('involvedObject', {}).get('name') == name
                and (namespace is None or obj.raw.get('involvedObject', {}).get('namespace') == namespace)]


# --------------------------------------------------------------------------------------------
# Running the real operator against the emulator.
# --------------------------------------------------------------------------------------------

STARTUP_TIMEOUT = 10.0
STOP_TIMEOUT = 10.0


def make_settings() -> kopf.OperatorSettings:
    """Settings for tests: fast, standalone, no managed webhooks, events posted. Adjust freely."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.admission.managed = None
    settings.admission.server = None
    settings.posting.enabled = True  # kopf.event()/info()/warn() post core/v1 events
    settings.posting.loggers = True  # and handlers' log lines too (Kopf 1.45's default: off)
    settings.networking.request_timeout = 10
    settings.networking.connect_timeout = 5
    settings.watching.reconnect_backoff = 0.1
    settings.queueing.exit_timeout = 2.0
    settings.execution.default_backoff = 0.5  # retry failed handlers fast, unless set per handler
    return settings


@dataclasses.dataclass
class RunningOperator:
    """A Kopf operator running as a task in the test's event loop."""
    registry: kopf.OperatorRegistry
    settings: kopf.OperatorSettings
    memo: kopf.Memo
    task: asyncio.Task[None]
    stop_flag: asyncio.Event

    @property
    def running(self) -> bool:
        return not self.task.done()

    def check(self) -> None:
        """Raise if the operator has exited (with its exception, if it failed)."""
        if self.task.done():
            self.task.result()
            raise RuntimeError("The operator has exited.")

    async def wait_for(self, predicate: Callable[[], Any], *, timeout: float = 10.0,
                       interval: float = 0.05, message: str | None = None) -> Any:
        """Like ``wait_for()``, but fails at once if the operator dies meanwhile."""
        async def guarded() -> Any:
            self.check()
            return await _maybe_await(predicate())
        guarded.__name__ = getattr(predicate, '__name__', 'condition')
        return await wait_for(guarded, timeout=timeout, interval=interval, message=message)


def load_module(module: str | os.PathLike[str] | types.ModuleType) -> types.ModuleType:
    """Import an operator module by dotted name or by .py path (once, as Python does)."""
    if isinstance(module, types.ModuleType):
        return module
    path = pathlib.Path(module)
    if path.suffix == '.py':
        name = f'_operator_under_test_{path.stem}'
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        return sys.modules[name]
    return importlib.import_module(str(module))


def _raise_stop_flag_when_kopf_exits(stop_flag: asyncio.Event, operator: asyncio.Task[None]) -> None:
    """
    If Kopf exits on its own (a failed startup, a crashed root task), raise the stop flag at once.

    Kopf 1.45's "stop-flag waiter" task (``_core/reactor/running.py: stop_flag_checker``) is not
    cancelled with its parent, and at exit Kopf waits 5 s for such "hung" tasks — i.e. for our
    flag. The parent, the "stop-flag checker" root task, ends as soon as Kopf begins to exit.
    Polled with loop callbacks, not a task: Kopf counts tasks born after its start as its own.
    """
    loop = asyncio.get_running_loop()

    def poll() -> None:
        if stop_flag.is_set() or operator.done():
            return
        checker = next((t for t in asyncio.all_tasks(loop) if t.get_name() == 'stop-flag checker'), None)
        if checker is None:
            loop.call_soon(poll)
        else:
            checker.add_done_callback(lambda _: stop_flag.set())

    loop.call_soon(poll)


@contextlib.asynccontextmanager
async def run_operator(
        emulator: Emulator,
        *,
        registry: kopf.OperatorRegistry | None = None,
        module: str | os.PathLike[str] | types.ModuleType | None = None,
        settings: kopf.OperatorSettings | None = None,
        memo: kopf.Memo | None = None,
        namespaces: Collection[str] = (),
        startup_timeout: float = STARTUP_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
) -> AsyncIterator[RunningOperator]:
    """
    Run ``kopf.operator()`` against the emulator until the block exits; then stop it.

    ``module`` is imported first (its decorators register into kopf's default registry, which is
    used unless ``registry`` is given). Cluster-wide unless ``namespaces`` are given. Startup
    waits for the startup handlers (``ready_flag``); exit sets the stop flag, waits for a clean
    stop and re-raises the operator's failure. Either step failing its timeout raises.
    """
    if module is not None:
        load_module(module)
    registry = registry if registry is not None else kopf.get_default_registry()
    settings = settings if settings is not None else make_settings()
    memo = memo if memo is not None else kopf.Memo()

    # Pre-populated credentials: no login handler is run or needed, the registry is untouched.
    vault = Vault()
    await vault.populate({'kmock-emulator': kopf.ConnectionInfo(server=emulator.url, default_namespace='default')})

    stop_flag = asyncio.Event()
    ready_flag = asyncio.Event()
    task = asyncio.create_task(kopf.operator(
        registry=registry, settings=settings, memo=memo, vault=vault,
        clusterwide=not namespaces, namespaces=namespaces, standalone=True,
        stop_flag=stop_flag, ready_flag=ready_flag,
    ), name='kopf-operator-under-test')
    _raise_stop_flag_when_kopf_exits(stop_flag, task)
    op = RunningOperator(registry=registry, settings=settings, memo=memo, task=task, stop_flag=stop_flag)

    try:
        ready = asyncio.create_task(ready_flag.wait())
        done, _ = await asyncio.wait({ready, task}, timeout=startup_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if task in done:
            op.check()  # re-raise the startup failure
        if ready not in done:
            raise TimeoutError(f"The operator did not start in {startup_timeout}s.")
        yield op
    finally:
        stop_flag.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=stop_timeout)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise TimeoutError(f"The operator did not stop in {stop_timeout}s.") from None
