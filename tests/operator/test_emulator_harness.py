"""
Proof that the harness runs the real Kopf operator against kmock's emulator, end to end.

The handlers here are throwaway (own registry, never the default one): they exist only to show
create → finalizer + status → delete → finalizer removed → gone.
"""
import kopf
import pytest
from emulator import ADMISSION_POLICIES, CRDS, EVENTS, NAMESPACES, PODS, EmulatorAPIError, wait_for

FINALIZER = 'harness.policy-operator.dev/cleanup'


def make_registry(log: list[str]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.create('policy-operator.dev', 'v1alpha1', 'admissionpolicies', registry=registry, id='harness')
    async def created(name: str, body: kopf.Body, patch: kopf.Patch, meta: kopf.Meta, **_: object) -> None:
        log.append(f'created {name}')
        kopf.info(body, reason='Activated', message='the policy is enforced')
        patch.metadata['finalizers'] = [*meta.get('finalizers', []), FINALIZER]
        patch.status['phase'] = 'Active'
        patch.status['observedGeneration'] = meta.get('generation')

    @kopf.on.update('policy-operator.dev', 'v1alpha1', 'admissionpolicies', registry=registry, id='harness',
                    field='spec')
    async def updated(name: str, patch: kopf.Patch, meta: kopf.Meta, **_: object) -> None:
        log.append(f'updated {name}')
        patch.status['observedGeneration'] = meta.get('generation')

    @kopf.on.delete('policy-operator.dev', 'v1alpha1', 'admissionpolicies', registry=registry, id='harness')
    async def deleted(name: str, patch: kopf.Patch, meta: kopf.Meta, **_: object) -> None:
        log.append(f'deleted {name}')
        patch.metadata['finalizers'] = [f for f in meta.get('finalizers', []) if f != FINALIZER]

    return registry


POLICY = {
    'apiVersion': 'policy-operator.dev/v1alpha1',
    'kind': 'AdmissionPolicy',
    'metadata': {'name': 'deny-offensive-pod-names'},
    'spec': {
        'match': {'resources': [{'apiGroups': [''], 'apiVersions': ['v1'], 'resources': ['pods'],
                                 'operations': ['CREATE']}]},
        'validations': [{'expression': "!object.metadata.name.contains('offensive')"}],
    },
}


async def test_policy_lifecycle_through_kopf(emulator, run_operator):
    log: list[str] = []
    async with run_operator(registry=make_registry(log)) as op:
        await emulator.create(ADMISSION_POLICIES, POLICY)

        def finalized_and_active():
            obj = emulator.peek(ADMISSION_POLICIES, 'deny-offensive-pod-names')
            return (obj is not None
                    and FINALIZER in obj['metadata'].get('finalizers', [])
                    and obj.get('status', {}).get('phase') == 'Active'
                    and obj)

        obj = await op.wait_for(finalized_and_active)
        assert obj['status']['observedGeneration'] == 1
        assert 'kopf.zalando.org/KopfFinalizerMarker' in obj['metadata']['finalizers']  # Kopf's own
        assert obj['metadata']['uid'] and obj['metadata']['resourceVersion']
        assert log == ['created deny-offensive-pod-names']

        # A spec change: new generation → the update handler → observedGeneration follows.
        await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names', {'spec': {'enforcement': 'Warn'}})
        await op.wait_for(lambda: (emulator.peek(ADMISSION_POLICIES, 'deny-offensive-pod-names') or {})
                          .get('status', {}).get('observedGeneration') == 2)

        # The handler's event is posted (for a cluster-scoped object: in namespace "default").
        events = await wait_for(lambda: [e for e in emulator.events_for('deny-offensive-pod-names')
                                         if e['reason'] == 'Activated'])
        assert events[0]['metadata']['name'].startswith('kopf-event-')
        assert events[0]['metadata']['namespace'] == 'default'
        assert events[0]['involvedObject']['uid'] == obj['metadata']['uid']

        deleting = await emulator.delete(ADMISSION_POLICIES, 'deny-offensive-pod-names')
        assert deleting is not None and deleting['metadata'].get('deletionTimestamp')

        async def gone():
            return await emulator.get(ADMISSION_POLICIES, 'deny-offensive-pod-names') is None

        await op.wait_for(gone)
        assert log == ['created deny-offensive-pod-names', 'updated deny-offensive-pod-names',
                       'deleted deny-offensive-pod-names']
        assert op.running

    assert op.task.done() and op.task.exception() is None


async def test_existing_objects_are_handled_at_startup(emulator, run_operator):
    log: list[str] = []
    emulator.kmock.put_object(ADMISSION_POLICIES, POLICY)  # exists before the operator starts
    async with run_operator(registry=make_registry(log)) as op:
        await op.wait_for(lambda: (emulator.peek(ADMISSION_POLICIES, 'deny-offensive-pod-names') or {})
                       .get('status', {}).get('phase') == 'Active')
    assert log == ['created deny-offensive-pod-names']


async def test_failed_json_patch_test_answers_422(emulator):
    obj = await emulator.create(ADMISSION_POLICIES, POLICY)
    rv = obj['metadata']['resourceVersion']
    with pytest.raises(EmulatorAPIError) as err:
        await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names', [
            {'op': 'test', 'path': '/metadata/resourceVersion', 'value': 'stale'},
            {'op': 'add', 'path': '/metadata/finalizers', 'value': ['x']},
        ])
    assert err.value.status == 422
    assert err.value.body['code'] == 422
    unchanged = await emulator.get(ADMISSION_POLICIES, 'deny-offensive-pod-names')
    assert unchanged is not None and unchanged['metadata']['resourceVersion'] == rv
    assert 'finalizers' not in unchanged['metadata']

    patched = await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names', [
        {'op': 'test', 'path': '/metadata/resourceVersion', 'value': rv},
        {'op': 'add', 'path': '/metadata/finalizers', 'value': ['x']},
    ])
    assert patched['metadata']['finalizers'] == ['x']
    assert int(patched['metadata']['resourceVersion']) > int(rv)


async def test_metadata_semantics(emulator):
    created = await emulator.create(ADMISSION_POLICIES, POLICY)
    meta = created['metadata']
    assert meta['generation'] == 1 and meta['uid'] and meta['creationTimestamp']
    assert 'namespace' not in meta  # cluster-scoped

    # Status via the subresource: no new generation; status via the main resource is ignored.
    after_status = await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names',
                                        {'status': {'phase': 'Pending'}}, subresource='status')
    assert after_status['status'] == {'phase': 'Pending'}
    assert after_status['metadata']['generation'] == 1
    assert after_status['metadata']['resourceVersion'] != meta['resourceVersion']
    ignored = await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names',
                                   {'status': {'phase': 'Failed'}, 'metadata': {'labels': {'a': 'b'}}})
    assert ignored['status'] == {'phase': 'Pending'}
    assert ignored['metadata']['generation'] == 1

    # A spec change bumps the generation; a no-op patch changes nothing.
    changed = await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names', {'spec': {'enforcement': 'Warn'}})
    assert changed['metadata']['generation'] == 2
    same = await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names', {'spec': {'enforcement': 'Warn'}})
    assert same['metadata']['resourceVersion'] == changed['metadata']['resourceVersion']

    # generateName; namespaced objects get their namespace; a replace with a stale version is 409.
    event = await emulator.create(EVENTS, {'metadata': {'generateName': 'ev-'}, 'reason': 'X'}, namespace='ns1')
    assert event['metadata']['name'].startswith('ev-') and event['metadata']['namespace'] == 'ns1'
    with pytest.raises(EmulatorAPIError) as err:
        await emulator.replace(ADMISSION_POLICIES, 'deny-offensive-pod-names', dict(POLICY, metadata={
            'name': 'deny-offensive-pod-names', 'resourceVersion': meta['resourceVersion']}))
    assert err.value.status == 409

    # Discovery knows the CRD and it is stored; namespaces are declared.
    assert await emulator.get(CRDS, 'admissionpolicies.policy-operator.dev') is not None
    assert await emulator.list(NAMESPACES) == []
    _, apis = await emulator.request('GET', '/apis/policy-operator.dev/v1alpha1')
    [entry] = [r for r in apis['resources'] if r['name'] == 'admissionpolicies']
    assert entry['kind'] == 'AdmissionPolicy' and entry['namespaced'] is False
    assert any(r['name'] == 'admissionpolicies/status' for r in apis['resources'])


async def test_watch_resumes_from_resource_version(emulator):
    first = await emulator.create(ADMISSION_POLICIES, POLICY)
    status, listing = await emulator.request('GET', emulator.path(ADMISSION_POLICIES))
    assert status == 200 and listing['metadata']['resourceVersion'] == first['metadata']['resourceVersion']
    await emulator.patch(ADMISSION_POLICIES, 'deny-offensive-pod-names', {'metadata': {'labels': {'a': 'b'}}})
    await emulator.delete(ADMISSION_POLICIES, 'deny-offensive-pod-names')

    path = emulator.path(ADMISSION_POLICIES)
    rv = listing['metadata']['resourceVersion']
    status, text = await emulator.request('GET', f'{path}?watch=true&resourceVersion={rv}&timeoutSeconds=0.3')
    assert status == 200
    types = [line.split('"type": "')[1].split('"')[0] for line in text.splitlines() if line.strip()]
    assert types == ['MODIFIED', 'DELETED']


async def test_namespaced_resources_in_selected_namespaces(emulator, run_operator):
    """Namespace objects are served (kmock cannot), so Kopf can watch namespaces by pattern."""
    registry = kopf.OperatorRegistry()

    @kopf.on.create('v1', 'pods', registry=registry, id='label')
    async def label_pod(patch: kopf.Patch, **_: object) -> None:
        patch.metadata.setdefault('labels', {})['seen'] = 'yes'

    await emulator.create(NAMESPACES, {'metadata': {'name': 'team-a'}})
    await emulator.create(NAMESPACES, {'metadata': {'name': 'other'}})
    async with run_operator(registry=registry, namespaces=['team-*']) as op:
        await emulator.create(PODS, {'metadata': {'name': 'p'}, 'spec': {}}, namespace='team-a')
        await emulator.create(PODS, {'metadata': {'name': 'p'}, 'spec': {}}, namespace='other')
        # Kopf ignores namespaces in its watcher's initial listing (it got them from an earlier
        # listing): a namespace must appear after the watch starts to be noticed — a Kopf race
        # that a real API server has too, so wait for the watch before creating one.
        await op.wait_for(lambda: emulator.is_watched(NAMESPACES))
        await emulator.create(NAMESPACES, {'metadata': {'name': 'team-b'}})  # appears while running
        await emulator.create(PODS, {'metadata': {'name': 'p'}, 'spec': {}}, namespace='team-b')
        for ns in ('team-a', 'team-b'):
            await op.wait_for(lambda ns=ns: (emulator.peek(PODS, 'p', namespace=ns) or {})
                              .get('metadata', {}).get('labels', {}).get('seen') == 'yes')
    other = emulator.peek(PODS, 'p', namespace='other')
    assert other is not None and 'labels' not in other['metadata']


@pytest.mark.filterwarnings("ignore:coroutine 'authenticator' was never awaited:RuntimeWarning")  # Kopf's
async def test_operator_failure_surfaces(emulator, run_operator):
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def broken(**_: object) -> None:
        raise kopf.PermanentError("cannot start")

    with pytest.raises(Exception, match="handlers failed"):  # kopf's ActivityError is not public
        async with run_operator(registry=registry):
            pass  # pragma: no cover
