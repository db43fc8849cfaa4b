"""Scenario 13: a StreamingCluster whose nodes serve mutual TLS from Secrets,
with roles, installed and reconciled under the chart's RBAC.

The certificates are the test bed's (a CA, a serving certificate for
``localhost``, client certificates): the node Secret is of type
``kubernetes.io/tls`` with ``tls.crt``, ``tls.key`` and ``ca.crt``, the way
cert-manager writes it, and an identities Secret gives the client certificate
``CN=headrace`` the producer and consumer roles. Node pods advertise pod IPs,
so clients check the nodes' certificates against ``localhost``
(``ClientTLS.server_name``, as they would against a DNS name of the nodes'
Service in a real cluster).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from e2e.conftest import E2E
from e2e.harness import API_VERSION, CLUSTER_LABEL, Kube, cluster_manifest, is_ready, until
from headrace import errors
from headrace.client import HeadraceClient
from headrace.client.client import ClientOptions
from headrace.cluster import TLSMode
from headrace.tls import ClientTLS
from headrace_testbed.pki import ETCD_CLIENT, ETCD_NOBODY, EtcdPki, write_etcd_pki

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(300),
]

NAME = "sec"
PCHANNELS = 2


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def secrets(namespace: str, pki: EtcdPki) -> list[dict[str, object]]:
    identities = {
        "identities": [
            {"name": "e2e-app", "roles": ["producer", "consumer"], "certificate_cn": "headrace"}
        ]
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": f"{NAME}-node-tls", "namespace": namespace},
            "data": {
                "tls.crt": _b64(pki.cert("server")),
                "tls.key": _b64(pki.key("server")),
                "ca.crt": _b64(pki.ca_cert),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{NAME}-identities", "namespace": namespace},
            "stringData": {"identities.json": json.dumps(identities)},
        },
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(
    e2e: E2E, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Kube, EtcdPki]]:
    pki = write_etcd_pki(tmp_path_factory.mktemp("node-pki"))
    kube = e2e.admin()
    for secret in secrets(e2e.namespace, pki):
        await kube.apply(secret)
    manifest = cluster_manifest(
        NAME, e2e.namespace, e2e.etcd_endpoint, nodes=2, pchannels=PCHANNELS
    )
    manifest["spec"]["tls"] = {
        "secretName": f"{NAME}-node-tls",
        "requireClientCertificates": True,
        "identitiesSecretName": f"{NAME}-identities",
    }
    await kube.apply(manifest)
    try:
        yield kube, pki
    finally:
        await kube.delete(API_VERSION, "StreamingCluster", e2e.namespace, NAME)

        async def gone() -> bool:
            pods = await kube.list("v1", "Pod", e2e.namespace, {CLUSTER_LABEL: NAME})
            body = await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, NAME)
            return body is None and not pods

        await until(gone, f"{NAME} and its pods deleted", limit=180)
        for secret in (f"{NAME}-node-tls", f"{NAME}-identities"):
            await kube.delete("v1", "Secret", e2e.namespace, secret)
        kube.close()


def client(e2e: E2E, tls: ClientTLS | None) -> HeadraceClient:
    return HeadraceClient(e2e.etcd_url, f"{e2e.namespace}.{NAME}", options=ClientOptions(tls=tls))


def client_tls(pki: EtcdPki, stem: str | None) -> ClientTLS:
    return ClientTLS(
        pki.ca_cert,
        pki.cert(stem) if stem else None,
        pki.key(stem) if stem else None,
        server_name="localhost",
    )


async def test_a_cluster_with_mutual_tls_from_secrets_serves_only_who_it_should(
    e2e: E2E, secured: tuple[Kube, EtcdPki]
) -> None:
    kube, pki = secured

    async def ready() -> bool:
        return is_ready(await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, NAME))

    await until(ready, f"{NAME} Ready (probed on the plaintext health port)", limit=180)
    pods = await kube.list("v1", "Pod", e2e.namespace, {CLUSTER_LABEL: NAME})
    assert len(pods) == 2
    for pod in pods:
        args = pod["spec"]["containers"][0]["args"]
        assert "--tls-client-ca" in args and "--auth-file" in args
    async with client(e2e, client_tls(pki, ETCD_CLIENT)) as c:
        await c.wait_ready(f"pchannel-00{PCHANNELS - 1}", timeout=60)
        assert {n.tls for n in c.view.nodes.values()} == {TLSMode.MUTUAL}
        vchannels = [f"secure-{i}" for i in range(8)]
        async with c.producer() as producer:
            for i in range(40):
                await producer.send(vchannels[i % 8], f"{i}".encode())
        got: list[int] = []
        for vchannel in vchannels:
            async with c.consume(vchannel) as consumer:
                async for entry in consumer:
                    got.append(int(entry.message.payload))
                    if len([g for g in got if g % 8 == vchannels.index(vchannel)]) == 5:
                        break
        assert sorted(got) == list(range(40))
    async with client(e2e, client_tls(pki, None)) as c, c.producer() as producer:
        with pytest.raises(errors.InvalidArgument, match="requires a client certificate"):
            await producer.send("secure-0", b"no certificate")
    async with client(e2e, client_tls(pki, ETCD_NOBODY)) as c, c.producer() as producer:
        with pytest.raises(errors.PermissionDenied, match="not authenticated"):
            await producer.send("secure-0", b"a certificate with no identity")
    async with client(e2e, None) as c, c.producer() as producer:
        with pytest.raises(errors.InvalidArgument, match="requires TLS"):
            await producer.send("secure-0", b"plaintext")
