"""TLS and roles on the node's gRPC server: mutual TLS, rotation under load,
each role's allowed and denied calls, tokens and their files changing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.client import HeadraceClient
from headrace.client.client import ClientOptions
from headrace.client.sending import ProducerOptions
from headrace.cluster import NodeInfo, TLSMode
from headrace.node.auth import Caller, Identity, Role, parse_identities, refusal
from headrace.tls import ClientTLS, ServerTLS, check_pair
from headrace_testbed.pki import ETCD_CLIENT, ETCD_NOBODY, SERVER_NEXT, EtcdPki, write_etcd_pki
from tests.node.harness import Cluster, until

P = "pchannel-000"
PRODUCE = "/headrace.v1.Producer/Produce"
CONSUME = "/headrace.v1.Consumer/Consume"
OPEN_WAL = "/headrace.v1.Manager/OpenWAL"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> EtcdPki:
    return write_etcd_pki(tmp_path_factory.mktemp("pki"))


@dataclasses.dataclass
class Served:
    cluster: Cluster
    tls: ServerTLS


@pytest.fixture
async def served(cluster: Cluster, pki: EtcdPki, tmp_path: Path) -> AsyncIterator[Served]:
    """P served by node-a over mutual TLS, its certificate files copied (to rotate)."""
    cert, key = tmp_path / "node.crt", tmp_path / "node.key"
    shutil.copy(pki.cert("server"), cert)
    shutil.copy(pki.key("server"), key)
    tls = ServerTLS(cert, key, pki.ca_cert)
    await cluster.configure([P])
    await cluster.start_node("node-a", tls=tls)
    await cluster.assign(P, "node-a", 1)
    yield Served(cluster, tls)


def client_tls(
    pki: EtcdPki, stem: str | None = ETCD_CLIENT, token: Path | None = None
) -> ClientTLS:
    return ClientTLS(
        pki.ca_cert,
        pki.cert(stem) if stem else None,
        pki.key(stem) if stem else None,
        token,
    )


def client(cluster: Cluster, tls: ClientTLS | None) -> HeadraceClient:
    return HeadraceClient(cluster.url, "test", options=ClientOptions(tls=tls))


async def round_trip(c: HeadraceClient, count: int = 5, vchannel: str = "v") -> list[bytes]:
    async with c.producer() as producer:
        for i in range(count):
            await producer.send(vchannel, f"m{i}".encode())
    got: list[bytes] = []
    async with c.consume(vchannel) as consumer:
        async for entry in consumer:
            got.append(entry.message.payload)
            if len(got) == count:
                break
    return got


async def test_mutual_tls_round_trip_and_the_node_advertises_it(
    served: Served, pki: EtcdPki
) -> None:
    kv = await served.cluster.metastore.get(served.cluster.keys.node("node-a"))
    assert kv is not None and NodeInfo.from_json(kv.value).tls is TLSMode.MUTUAL
    async with client(served.cluster, client_tls(pki)) as c:
        assert await round_trip(c) == [f"m{i}".encode() for i in range(5)]


async def test_clients_without_what_the_node_requires_get_a_clear_error(
    served: Served, pki: EtcdPki
) -> None:
    async with client(served.cluster, None) as c, c.producer() as producer:
        with pytest.raises(errors.HeadraceError, match="requires TLS: give the client a CA"):
            await producer.send("v", b"x")
    async with client(served.cluster, client_tls(pki, None)) as c, c.producer() as producer:
        with pytest.raises(errors.HeadraceError, match="requires a client certificate"):
            await producer.send("v", b"x")


async def test_an_expired_or_foreign_client_certificate_is_refused(
    served: Served, pki: EtcdPki
) -> None:
    for stem in ("expired-client", "stranger"):
        async with client(served.cluster, client_tls(pki, stem)) as c:
            producer = c.producer(ProducerOptions(deadline=2.0))
            try:
                with pytest.raises(errors.HeadraceError, match="UNAVAILABLE"):
                    await producer.send("v", b"x")
            finally:
                await producer.close()


async def test_certificates_rotate_under_load_without_losing_a_message(
    served: Served, pki: EtcdPki
) -> None:
    sent: list[bytes] = []
    stop = asyncio.Event()
    async with client(served.cluster, client_tls(pki)) as c:

        async def produce() -> None:
            async with c.producer() as producer:
                i = 0
                while not stop.is_set():
                    await producer.send("v", f"r{i}".encode())
                    sent.append(f"r{i}".encode())
                    i += 1
                    await asyncio.sleep(0.002)

        producing = asyncio.create_task(produce())
        await until(lambda: len(sent) >= 50)
        # Install the next certificate as a rotation tool would: write, then rename.
        for source, target in (
            (pki.cert(SERVER_NEXT), served.tls.cert),
            (pki.key(SERVER_NEXT), served.tls.key),
        ):
            staged = target.with_suffix(".new")
            shutil.copy(source, staged)
            os.replace(staged, target)
        node = served.cluster.nodes["node-a"]
        assert node.tls_credentials is not None
        # A new client's handshake picks the rotated files up.
        async with client(served.cluster, client_tls(pki)) as fresh:
            assert await round_trip(fresh, 1, "other") == [b"m0"]
        assert node.tls_credentials.reloads == 1
        mark = len(sent)
        await until(lambda: len(sent) >= mark + 50)
        stop.set()
        await producing
        got: list[bytes] = []
        async with c.consume("v") as consumer:
            async for entry in consumer:
                if entry.message.payload.startswith(b"r"):
                    got.append(entry.message.payload)
                if len(got) == len(sent):
                    break
    assert got == sent


def token_file(directory: Path, name: str, token: str) -> Path:
    path = directory / f"{name}.token"
    path.write_text(token + "\n")
    return path


def identities_file(path: Path, entries: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"identities": entries}))
    return path


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
async def guarded(cluster: Cluster, pki: EtcdPki, tmp_path: Path) -> AsyncIterator[Path]:
    """P served over TLS (no client certificates) with roles; yields the identities file."""
    auth = identities_file(
        tmp_path / "identities.json",
        [
            {"name": "writer", "roles": ["producer"], "token_sha256": digest("w-token")},
            {"name": "reader", "roles": ["consumer"], "token_sha256": digest("r-token")},
            {"name": "ops", "roles": ["admin"], "token_sha256": digest("ops-token")},
        ],
    )
    await cluster.configure([P])
    tls = ServerTLS(pki.cert("server"), pki.key("server"))
    await cluster.start_node("node-a", tls=tls, auth_file=auth)
    await cluster.assign(P, "node-a", 1)
    yield auth


async def test_each_role_is_allowed_its_calls_and_denied_the_others(
    cluster: Cluster, guarded: Path, pki: EtcdPki, tmp_path: Path
) -> None:
    writer = client_tls(pki, None, token_file(tmp_path, "w", "w-token"))
    reader = client_tls(pki, None, token_file(tmp_path, "r", "r-token"))
    ops = client_tls(pki, None, token_file(tmp_path, "ops", "ops-token"))
    async with client(cluster, writer) as c:
        async with c.producer() as producer:
            await producer.send("v", b"from the writer")
        with pytest.raises(errors.PermissionDenied, match="needs role consumer; writer has"):
            async with c.consume("v") as consumer:
                await anext(aiter(consumer))
        with pytest.raises(errors.PermissionDenied, match="needs role admin; writer"):
            await c.manager(c.view.owner(P).address).open_wal(P, 1)  # type: ignore[union-attr]
    async with client(cluster, reader) as c:
        async with c.consume("v") as consumer:
            entry = await anext(aiter(consumer))
        assert entry.message.payload == b"from the writer"
        async with c.producer() as producer:
            with pytest.raises(errors.PermissionDenied, match="needs role producer; reader"):
                await producer.send("v", b"no")
    async with client(cluster, ops) as c:
        listed = await c.manager(c.view.owner(P).address).list_wals()  # type: ignore[union-attr]
        assert listed.find(P) is not None
        async with c.producer() as producer:
            await producer.send("v", b"admin may produce")
    node = cluster.nodes["node-a"]
    assert node.auth is not None and node.auth.denied == 3


async def test_a_wrong_token_and_a_changed_token_file(
    cluster: Cluster, guarded: Path, pki: EtcdPki, tmp_path: Path
) -> None:
    path = token_file(tmp_path, "w", "not-a-token")
    async with client(cluster, client_tls(pki, None, path)) as c, c.producer() as producer:
        with pytest.raises(errors.PermissionDenied, match="not authenticated"):
            await producer.send("v", b"x")
        path.write_text("w-token\n")  # the client reads its token file again
        os.utime(path, ns=(1, 1))
        await producer.send("v", b"y")
    # The node reads its identities again: the writer's token is withdrawn.
    identities_file(guarded, [{"name": "ops", "roles": ["admin"], "certificate_cn": "x"}])
    async with client(cluster, client_tls(pki, None, path)) as c, c.producer() as producer:
        with pytest.raises(errors.PermissionDenied, match="not authenticated"):
            await producer.send("v", b"z")


async def test_a_plaintext_client_never_sends_its_token(pki: EtcdPki, tmp_path: Path) -> None:
    env = {"HEADRACE_TOKEN_FILE": str(token_file(tmp_path, "t", "secret"))}
    with pytest.raises(errors.InvalidArgument, match="needs TLS"):
        ClientTLS.from_env(env)


def test_bad_files_and_identities_are_named() -> None:
    with pytest.raises(errors.InvalidArgument, match="cannot read the certificate /nonexistent"):
        check_pair(Path("/nonexistent"), Path("/nonexistent"))
    with pytest.raises(errors.InvalidArgument, match="token_sha256 is not 64 hex digits"):
        parse_identities('{"identities": [{"name": "a", "roles": [], "token_sha256": "x"}]}', "f")
    with pytest.raises(errors.InvalidArgument, match="roles are producer, consumer, admin"):
        parse_identities('{"identities": [{"name": "a", "roles": ["root"]}]}', "f")
    with pytest.raises(errors.InvalidArgument, match="neither token_sha256 nor certificate_cn"):
        parse_identities('{"identities": [{"name": "a", "roles": ["admin"]}]}', "f")


def test_mismatched_certificate_and_key(pki: EtcdPki) -> None:
    with pytest.raises(errors.InvalidArgument, match="do not load as a pair"):
        check_pair(pki.cert("server"), pki.key(ETCD_CLIENT))


def test_refusal_decisions() -> None:
    ops = Identity("ops", frozenset({Role.ADMIN}), certificate_cn="ops")
    app = Identity("app", frozenset({Role.PRODUCER}), token_sha256=digest("t"))
    ids = (ops, app)
    assert refusal("/grpc.health.v1.Health/Check", Caller(), ids) == ""
    assert refusal(PRODUCE, Caller(token="t"), ids) == ""
    assert "needs role consumer; app" in refusal(CONSUME, Caller(token="t"), ids)
    assert refusal(OPEN_WAL, Caller(certificate_cn="ops"), ids) == ""
    assert refusal(CONSUME, Caller(certificate_cn="ops"), ids) == ""  # admin implies all
    assert "certificate CN=nobody" in refusal(PRODUCE, Caller(certificate_cn=ETCD_NOBODY), ids)
    assert "no token and no client certificate" in refusal(PRODUCE, Caller(), ids)
    assert "needs role admin" in refusal("/headrace.v1.Manager/Unknown", Caller(token="t"), ids)
