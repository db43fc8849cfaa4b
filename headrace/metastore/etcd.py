"""etcd metastore over gRPC, using aetcd's etcd v3 protocol bindings.

aetcd's high-level client lacks lease compares, fractional TTLs and a way to
tell a lost watch stream from a quiet one, so this module drives the protocol
stubs and messages aetcd ships (``aetcd.rpc``) over its own ``grpc.aio``
channel; :mod:`headrace.metastore.etcd_wire` does the pure translation.

* Every call has a deadline (``request_timeout``); connection failures and
  deadlines become :class:`headrace.errors.Unavailable` naming the endpoint.
* A lease that is gone raises :class:`LeaseExpired`. etcd leases have whole
  seconds and a server minimum (1 s with the test bed's raft timings), so
  ``grant_lease(ttl)`` rounds up.
* Each watch has its own gRPC stream; a stream that breaks (server gone,
  connection lost, detected by gRPC keepalive pings) raises ``Unavailable`` from
  the iterator instead of going quiet. A watch from a compacted revision raises
  :class:`headrace.errors.Truncated`.
* Several endpoints (``etcd://h1:2379,h2:2379``) share one channel whose
  pick-first policy fails over between them; their names are resolved to IP
  addresses when the store is opened (over TLS every server certificate must
  then be valid for the first endpoint's name).
* ``etcds://`` speaks TLS, with the CA and client certificate of
  :class:`~headrace.metastore.etcd_security.EtcdSecurity`. With a user, the
  store authenticates when it opens and sends the token with every call; a
  token etcd no longer accepts (simple tokens expire after ``--auth-token-ttl``
  idle seconds) is renewed once and the call repeated, which is safe because
  etcd checks the token before doing anything. aetcd's own ``Client`` cannot
  do this: it only opens insecure channels and authenticates once.
* Rejected credentials (wrong password, a role without the permission, an
  untrusted server certificate, a client certificate etcd refuses) raise
  :class:`headrace.errors.PermissionDenied` naming what was refused.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import grpc
from aetcd import rpc

from headrace import errors
from headrace.metastore import etcd_wire as wire
from headrace.metastore.contract import (
    Compare,
    KeyValue,
    LeaseExpired,
    Metastore,
    Op,
    TxnResult,
    Watch,
    WatchEvent,
)
from headrace.metastore.etcd_security import (
    PLAINTEXT,
    EtcdCredentials,
    EtcdSecurity,
    load,
    read_password,
)
from headrace.metastore.etcd_wire import Endpoint
from headrace.metastore.ranges import check_lease_ttl, encode_key

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]

_EOF = cast(Any, grpc.aio).EOF
"""What ``read()`` of a finished gRPC stream returns (missing from grpc-stubs)."""
_CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


async def _resolve(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """IP addresses for several endpoints (IPv4 preferred), so one channel can hold them."""
    if len(endpoints) == 1:
        return list(endpoints)
    loop = asyncio.get_running_loop()
    resolved: list[Endpoint] = []
    for host, port in endpoints:
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise errors.Unavailable(f"cannot resolve etcd endpoint {host}:{port}: {exc}") from None
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        resolved.append((str(infos[0][4][0]), port))
    if len({":" in host for host, _ in resolved}) > 1:
        resolved = [(host, port) for host, port in resolved if ":" not in host]
    return resolved


def _channel(
    target: str, endpoints: Sequence[Endpoint], credentials: EtcdCredentials
) -> grpc.aio.Channel:
    if not credentials.tls:
        return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
    options: tuple[tuple[str, Any], ...] = _CHANNEL_OPTIONS
    if len(endpoints) > 1:
        options += (("grpc.ssl_target_name_override", endpoints[0][0]),)
    channel_credentials = grpc.ssl_channel_credentials(
        root_certificates=credentials.root_certificates,
        private_key=credentials.private_key,
        certificate_chain=credentials.certificate_chain,
    )
    return grpc.aio.secure_channel(target, channel_credentials, options=options)


class EtcdMetastore(Metastore):
    """The metastore on an etcd cluster; create with :meth:`connect`."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        request_timeout: float = 5.0,
        security: EtcdSecurity = PLAINTEXT,
    ) -> None:
        self.endpoints = list(endpoints)
        scheme = "etcds" if security.tls else "etcd"
        self.url = f"{scheme}://" + ",".join(wire.format_endpoint(e) for e in self.endpoints)
        self._where = ",".join(wire.format_endpoint(e) for e in self.endpoints)
        self._security = security
        self._timeout = request_timeout
        self._channel: grpc.aio.Channel | None = None
        self._kv: Any = None
        self._lease: Any = None
        self._watch: Any = None
        self._auth: Any = None
        self._token = ""
        self._token_lock = asyncio.Lock()
        self._closed = False
        self._watches: set[_EtcdWatch] = set()

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[Endpoint],
        *,
        connect_timeout: float = 3.0,
        request_timeout: float = 5.0,
        security: EtcdSecurity = PLAINTEXT,
    ) -> EtcdMetastore:
        """Open a channel, authenticate if ``security`` has a user, and check
        that etcd answers within ``connect_timeout``."""
        credentials = load(security.checked(), datetime.datetime.now(datetime.UTC))
        store = cls(endpoints, request_timeout=request_timeout, security=security)
        try:
            resolved = await _resolve(store.endpoints)
            store._channel = _channel(wire.channel_target(resolved), store.endpoints, credentials)
            store._kv = rpc.KVStub(store._channel)
            store._lease = rpc.LeaseStub(store._channel)
            store._watch = rpc.WatchStub(store._channel)
            store._auth = rpc.AuthStub(store._channel)
            await store._renew_token("", deadline=connect_timeout)
            await store._unary(
                store._kv.Range,
                rpc.RangeRequest(key=b"\0", count_only=True),
                deadline=connect_timeout,
            )
        except BaseException:
            await store.close()
            raise
        return store

    # -- plumbing ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise errors.Closed(f"etcd metastore {self.url} is closed")

    def _error(self, exc: grpc.aio.AioRpcError) -> errors.HeadraceError:
        if self._closed:
            return errors.Closed(f"etcd metastore {self.url} is closed")
        return wire.translate(exc, self._where, self._security)

    def _metadata(self) -> Metadata:
        return (("token", self._token),) if self._token else ()

    async def _renew_token(self, rejected: str, *, deadline: float | None = None) -> None:
        """Authenticate (if there is a user) unless another task already
        replaced the ``rejected`` token. Auth not enabled on etcd: no token."""
        if not self._security.user:
            return
        async with self._token_lock:
            if self._token != rejected:
                return
            password = read_password(self._security)
            request = rpc.AuthenticateRequest(name=self._security.user, password=password)
            try:
                response = await self._auth.Authenticate(request, timeout=deadline or self._timeout)
            except grpc.aio.AioRpcError as exc:
                if wire.auth_not_enabled(exc):
                    return
                raise self._error(exc) from None
            self._token = str(response.token)

    async def _authorized(self, attempt: Callable[[Metadata], Awaitable[T]]) -> T:
        """``attempt`` with the current token; once more with a new token if
        etcd rejected the token (before doing anything)."""
        token = self._token
        try:
            return await attempt(self._metadata())
        except wire.TokenRejected:
            if not self._security.user:
                raise
        await self._renew_token(token)
        return await attempt(self._metadata())

    async def _unary(self, method: Any, request: Any, *, deadline: float | None = None) -> Any:
        """Call a unary RPC; ``deadline`` (seconds) defaults to the request timeout."""
        self._check_open()

        async def attempt(metadata: Metadata) -> Any:
            try:
                return await method(request, timeout=deadline or self._timeout, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                raise self._error(exc) from None
            except grpc.aio.UsageError:
                raise errors.Closed(f"etcd metastore {self.url} is closed") from None

        return await self._authorized(attempt)

    # -- the contract -----------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        response = await self._unary(self._kv.Range, wire.range_request(key, False))
        return wire.to_kv(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        response = await self._unary(self._kv.Range, wire.range_request(prefix, True))
        return [wire.to_kv(kv) for kv in response.kvs]

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        if not isinstance(value, bytes):
            raise errors.InvalidArgument(f"value of {key!r} must be bytes")
        request = rpc.PutRequest(key=encode_key(key), value=value, lease=lease)
        response = await self._unary(self._kv.Put, request)
        return int(response.header.revision)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        response = await self._unary(self._kv.DeleteRange, wire.delete_request(key, prefix))
        return int(response.deleted)

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        request, depth = wire.txn_request(compares, success, failure)
        response = await self._unary(self._kv.Txn, request)
        leaf = wire.unwrap_txn(response, depth)
        gets = [
            [wire.to_kv(kv) for kv in op.response_range.kvs]
            for op in leaf.responses
            if op.WhichOneof("response") == "response_range"
        ]
        return TxnResult(bool(leaf.succeeded), int(response.header.revision), gets)

    async def grant_lease(self, ttl: float) -> int:
        check_lease_ttl(ttl)
        request = rpc.LeaseGrantRequest(TTL=wire.lease_ttl_seconds(ttl), ID=0)
        response = await self._unary(self._lease.LeaseGrant, request)
        if response.error:
            raise errors.Unavailable(f"etcd at {self._where} refused a lease: {response.error}")
        return int(response.ID)

    async def keep_alive(self, lease: int) -> None:
        self._check_open()

        async def attempt(metadata: Metadata) -> Any:
            call = self._lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease)]),
                timeout=self._timeout,
                metadata=metadata,
            )
            try:
                return await call.read()
            except grpc.aio.AioRpcError as exc:
                raise self._error(exc) from None
            finally:
                call.cancel()

        reply = await self._authorized(attempt)
        if reply is _EOF:
            raise errors.Unavailable(f"etcd at {self._where} closed the keep-alive stream")
        if reply.TTL <= 0:
            raise LeaseExpired(f"lease {lease:x} expired or was revoked")

    async def revoke_lease(self, lease: int) -> None:
        with contextlib.suppress(LeaseExpired):
            await self._unary(self._lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease))

    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> Watch:
        self._check_open()
        request = wire.watch_create_request(prefix, start_revision)

        async def attempt(metadata: Metadata) -> Watch:
            return await self._create_watch(request, metadata)

        return await self._authorized(attempt)

    async def _create_watch(self, request: Any, metadata: Metadata) -> Watch:
        call = self._watch.Watch(metadata=metadata)
        watch = _EtcdWatch(self, call)
        self._watches.add(watch)
        try:
            async with asyncio.timeout(self._timeout):
                await watch.created(request)
        except TimeoutError:
            await watch.close()
            raise errors.Unavailable(f"etcd at {self._where} did not create the watch") from None
        except BaseException:
            await watch.close()
            raise
        return watch

    async def revision(self) -> int:
        request = rpc.RangeRequest(key=b"\0", count_only=True)
        response = await self._unary(self._kv.Range, request)
        return int(response.header.revision)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            watch.cancel_stream()
        if self._channel is not None:
            await self._channel.close(None)


class _EtcdWatch(Watch):
    def __init__(self, store: EtcdMetastore, call: Any) -> None:
        self._store = store
        self._call = call
        self._closed = False
        self._pending: collections.deque[WatchEvent] = collections.deque()
        self._reading = asyncio.Lock()

    async def created(self, request: Any) -> None:
        """Send the create request and wait for etcd to confirm it."""
        try:
            await self._call.write(request)
            response = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise self._store._error(exc) from None
        self._check(response)
        if not response.created:
            raise errors.HeadraceError("etcd answered a watch request without creating it")
        self._pending.extend(wire.to_event(e) for e in response.events)

    def _check(self, response: Any) -> None:
        where = self._store._where
        if response is _EOF:
            raise errors.Unavailable(f"etcd at {where} ended the watch stream")
        if response.compact_revision:
            raise errors.Truncated(
                f"etcd at {where}: watch revisions up to {response.compact_revision} compacted",
                earliest=str(response.compact_revision),
            )
        if response.canceled:
            reason = response.cancel_reason or "no reason given"
            raise errors.Unavailable(f"etcd at {where} canceled the watch: {reason}")

    def __aiter__(self) -> _EtcdWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        """Ends when the watch is closed; raises Closed once the store is closed."""
        async with self._reading:
            while not self._closed:
                if self._pending:
                    return self._pending.popleft()
                await self._receive()
            if self._store._closed:
                raise errors.Closed(f"etcd metastore {self._store.url} is closed")
            raise StopAsyncIteration

    async def _receive(self) -> None:
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            if self._closed:
                return
            raise self._store._error(exc) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                return
            raise
        if not self._closed:
            self._check(response)
            self._pending.extend(wire.to_event(e) for e in response.events)

    def cancel_stream(self) -> None:
        self._closed = True
        self._pending.clear()
        self._call.cancel()

    async def close(self) -> None:
        self.cancel_stream()
        self._store._watches.discard(self)
