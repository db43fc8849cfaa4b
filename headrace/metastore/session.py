"""Liveness in the metastore: a lease kept alive in the background, and leader
election on top of it.

A :class:`Session` grants a lease of ``ttl`` seconds, optionally puts a key
bound to it, and renews it every ``ttl / 3`` seconds. :func:`start_exclusive`
binds a key only one live session may hold (a node's registration: a second
process with the same node id is refused).
A renewal that fails because the store does not answer is retried until the
lease would have expired; then (or at once, when the store says the lease is
gone) the session is *lost*: :attr:`Session.lost` is set and ``on_lost`` runs.
Keys bound to a lost session are, or soon will be, deleted by the store.

An :class:`Election` campaigns for a key with a session's lease: whoever
creates the key (compare "absent") leads until its session ends or it resigns.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

from headrace import errors
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.metastore.contract import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    LeaseExpired,
    Metastore,
    Put,
)

log = logging.getLogger(__name__)
OnLost = Callable[[], Awaitable[None] | None]
DEFAULT_TTL = 3.0


class Session:
    """A kept-alive lease; create with :meth:`start`, end with :meth:`close`."""

    def __init__(
        self, store: Metastore, lease: int, ttl: float, on_lost: OnLost | None = None
    ) -> None:
        self.store = store
        self.lease = lease
        self.ttl = ttl
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self._closed = False
        self._expires = asyncio.get_running_loop().time() + ttl
        self._task = guarded_task(
            self._keep_alive_loop(),
            f"session-{lease:x}",
            self._on_keep_alive_failure,
            finishable=True,  # it returns once the session is lost or closed
            logger=log,
        )

    @classmethod
    async def start(
        cls,
        store: Metastore,
        *,
        ttl: float = DEFAULT_TTL,
        key: str | None = None,
        value: bytes = b"",
        on_lost: OnLost | None = None,
    ) -> Session:
        """Grant the lease, start keeping it alive, and put ``key`` (if given) under it."""
        loop = asyncio.get_running_loop()
        granted_at = loop.time()
        lease = await store.grant_lease(ttl)
        session = cls(store, lease, ttl, on_lost)
        session._expires = granted_at + ttl
        if key is not None:
            try:
                await session.put(key, value)
            except BaseException:
                await session.close()
                raise
        return session

    async def put(self, key: str, value: bytes) -> int:
        """Put ``key`` bound to this session's lease; the store revision."""
        if self.lost.is_set():
            raise LeaseExpired(f"session lease {self.lease:x} is lost")
        try:
            return await self.store.put(key, value, lease=self.lease)
        except LeaseExpired:
            await self._mark_lost("the store no longer knows the lease")
            raise

    async def claim(self, key: str, value: bytes, *, replaces: int = 0) -> KeyValue | None:
        """Put ``key`` bound to this session unless another lease holds it.

        None once the key is this session's; else the key as its holder put
        it. A key bound to ``replaces`` (an earlier, lost lease of the same
        holder) is taken over rather than waited for.
        """
        mine = {self.lease, replaces} - {0}
        while True:
            if self.lost.is_set():
                raise LeaseExpired(f"session lease {self.lease:x} is lost")
            result = await self.store.txn(
                [Compare.absent(key)], [Put(key, value, self.lease)], [Get(key)]
            )
            if result.succeeded:
                return None
            holder = result.gets[0][0] if result.gets and result.gets[0] else None
            if holder is None:
                continue  # deleted between the transactions' reads: try again
            if holder.lease not in mine:
                return holder
            taken = await self.store.txn(
                [Compare.lease_is(key, holder.lease)], [Put(key, value, self.lease)]
            )
            if taken.succeeded:
                return None

    async def _keep_alive_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.ttl / 3
        delay = interval
        while not self._closed:
            await asyncio.sleep(delay)
            remaining = self._expires - loop.time()
            if remaining <= 0:
                await self._mark_lost(f"no keep-alive succeeded within {self.ttl} s")
                return
            sent_at = loop.time()
            try:
                async with asyncio.timeout(remaining):
                    await self.store.keep_alive(self.lease)
            except LeaseExpired:
                await self._mark_lost("the lease expired")
                return
            except (TimeoutError, errors.Unavailable) as exc:
                log.warning("session %x: keep-alive failed, retrying: %s", self.lease, exc)
                delay = min(interval, 0.2, max(0.0, self._expires - loop.time()))
                continue
            except errors.HeadraceError as exc:
                await self._mark_lost(f"keep-alive failed: {exc}")
                return
            self._expires = sent_at + self.ttl
            delay = interval

    async def _on_keep_alive_failure(self, failure: TaskFailure) -> None:
        """The renewing task failed on an unexpected error (it is logged with
        its traceback): nobody renews the lease any more, so the session is lost."""
        await self._mark_lost(f"nobody renews the lease any more: {failure.describe()}")

    async def _mark_lost(self, why: str) -> None:
        if self.lost.is_set() or self._closed:
            return
        log.warning("session %x lost: %s", self.lease, why)
        self.lost.set()
        if self._on_lost is None:
            return
        try:
            outcome = self._on_lost()
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            log.exception("session %x: on_lost callback failed", self.lease)

    async def close(self) -> None:
        """Stop renewing and revoke the lease (its keys go with it).

        If the store does not answer, the lease simply expires after its TTL.
        """
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self.lost.is_set():
            return
        try:
            await self.store.revoke_lease(self.lease)
        except (errors.Unavailable, errors.Closed) as exc:
            log.warning("session %x: revoke failed, the lease will expire: %s", self.lease, exc)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


EXCLUSIVE_POLL = 0.1
"""Seconds between looks at a held key while waiting for its lease to go."""


async def start_exclusive(
    store: Metastore,
    *,
    ttl: float,
    key: str,
    value: bytes,
    wait_s: float,
    replaces: int = 0,
) -> Session | KeyValue:
    """A session that alone holds ``key``, or the key of the live holder.

    A key bound to another lease is waited for up to ``wait_s`` seconds: a
    crashed holder's lease expires within its TTL and the key goes with it,
    while a live holder keeps renewing its lease. The result is the session
    once ``key`` is bound to it, else (the session closed again) the key as
    its holder still holds it. ``replaces``: see :meth:`Session.claim`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    session = await Session.start(store, ttl=ttl)
    try:
        while True:
            holder = await session.claim(key, value, replaces=replaces)
            if holder is None:
                return session
            if not await _released(store, key, holder.lease, deadline):
                await session.close()
                return holder
    except BaseException:
        await session.close()
        raise


async def _released(store: Metastore, key: str, lease: int, deadline: float) -> bool:
    """Whether ``key`` stops being bound to ``lease`` before ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        await asyncio.sleep(EXCLUSIVE_POLL)
        current = await store.get(key)
        if current is None or current.lease != lease:
            return True
    return False


class Election:
    """Campaign for ``key`` with the lease of ``session``."""

    def __init__(self, session: Session, key: str, value: bytes) -> None:
        self.session = session
        self.key = key
        self.value = value

    async def campaign(self) -> int:
        """Wait until this candidate leads; the key's create revision.

        Create revisions grow with every new leader, so the result orders
        leaderships. Raises LeaseExpired if the session is lost meanwhile.
        """
        store = self.session.store
        while True:
            if self.session.lost.is_set():
                raise LeaseExpired(f"session lease {self.session.lease:x} is lost")
            result = await store.txn(
                [Compare.absent(self.key)],
                [Put(self.key, self.value, self.session.lease)],
                [Get(self.key)],
            )
            if result.succeeded:
                return result.revision
            holder = result.gets[0][0] if result.gets and result.gets[0] else None
            if holder is not None and holder.lease == self.session.lease:
                return holder.create_revision
            await self._wait_vacant(result.revision + 1)

    async def _wait_vacant(self, start_revision: int) -> None:
        watch = await self.session.store.watch_prefix(self.key, start_revision=start_revision)

        async def deleted() -> None:
            async for event in watch:
                if event.kv.key == self.key and event.type is EventType.DELETE:
                    return
            raise errors.Unavailable(f"watch on {self.key!r} ended")

        waiters = [asyncio.create_task(deleted()), asyncio.create_task(self.session.lost.wait())]
        pending = set(waiters)
        try:
            done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            await cancel_and_settle(pending, what=f"waiting for {self.key!r} to be vacant")
            await watch.close()

    async def is_leader(self) -> bool:
        current = await self.session.store.get(self.key)
        return current is not None and current.lease == self.session.lease

    async def resign(self) -> bool:
        """Give up leadership (if held); whether this candidate was the leader."""
        result = await self.session.store.txn(
            [Compare.lease_is(self.key, self.session.lease)], [Delete(self.key)]
        )
        return result.succeeded
