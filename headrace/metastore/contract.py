"""The metastore contract: a small subset of etcd v3's model.

Keys and values are bytes-like strings; every write bumps a store-wide
revision. A key remembers the revision that created it, the one that last
modified it, its version (writes since creation) and its lease. Leases expire
``ttl`` seconds after their last keep-alive and take their keys with them.
Transactions compare and swap atomically. Watches deliver every change under a
prefix after a revision, in revision order.

Implementations: :mod:`headrace.metastore.etcd` (aetcd) and
:mod:`headrace.metastore.sqlite` (one file, shared by several processes). Both
pass ``tests/metastore/test_contract.py``. Failures to reach the store raise
:class:`headrace.errors.Unavailable` (retryable); a lost lease raises
:class:`LeaseExpired`.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import AsyncIterator, Sequence

from headrace import errors


class LeaseExpired(errors.HeadraceError):
    """The lease is gone (expired or revoked); keys bound to it are deleted."""

    code = errors.ErrorCode.FENCED


@dataclasses.dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


class Target(enum.Enum):
    VALUE = "value"
    VERSION = "version"
    CREATE_REVISION = "create_revision"
    MOD_REVISION = "mod_revision"
    LEASE = "lease"


class CompareOp(enum.Enum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


@dataclasses.dataclass(frozen=True, slots=True)
class Compare:
    """A condition on one key. A missing key has version, revisions and lease 0
    and compares unequal to every value."""

    key: str
    target: Target
    op: CompareOp
    value: bytes | int

    @classmethod
    def value_is(cls, key: str, value: bytes) -> Compare:
        return cls(key, Target.VALUE, CompareOp.EQUAL, value)

    @classmethod
    def mod_revision_is(cls, key: str, revision: int) -> Compare:
        return cls(key, Target.MOD_REVISION, CompareOp.EQUAL, revision)

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, Target.VERSION, CompareOp.EQUAL, 0)

    @classmethod
    def lease_is(cls, key: str, lease: int) -> Compare:
        return cls(key, Target.LEASE, CompareOp.EQUAL, lease)

    def holds(self, kv: KeyValue | None) -> bool:
        """Evaluate against the current state of the key (for implementations)."""
        if self.target is Target.VALUE:
            if kv is None:
                return self.op is CompareOp.NOT_EQUAL
            actual: bytes | int = kv.value
        else:
            actual = 0 if kv is None else getattr(kv, self.target.value)
        expected = self.value
        if isinstance(actual, bytes) != isinstance(expected, bytes):
            raise errors.InvalidArgument(f"compare of {self.target.value} with {expected!r}")
        if self.op is CompareOp.EQUAL:
            return actual == expected
        if self.op is CompareOp.NOT_EQUAL:
            return actual != expected
        if self.op is CompareOp.LESS:
            return actual < expected  # type: ignore[operator]
        return actual > expected  # type: ignore[operator]


@dataclasses.dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclasses.dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    """Store revision after the transaction."""
    gets: list[list[KeyValue]]
    """One list per Get op of the branch taken, in op order."""


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    kv: KeyValue
    """For DELETE: key and the deleting revision as mod_revision; value empty."""


class Watch(abc.ABC):
    """An open watch; iterate for events, close when done."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


class Metastore(abc.ABC):
    """Async key-value store with revisions, leases, transactions, watches."""

    url: str

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Keys starting with ``prefix`` in key order."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write; the new store revision."""

    @abc.abstractmethod
    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete; the number of keys deleted."""

    @abc.abstractmethod
    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult: ...

    @abc.abstractmethod
    async def grant_lease(self, ttl: float) -> int:
        """A new lease id living ``ttl`` seconds unless kept alive."""

    @abc.abstractmethod
    async def keep_alive(self, lease: int) -> None:
        """Renew the lease for its full TTL; LeaseExpired if it is gone."""

    @abc.abstractmethod
    async def revoke_lease(self, lease: int) -> None:
        """Revoke the lease and delete its keys; no error if already gone."""

    @abc.abstractmethod
    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> Watch:
        """Watch changes under ``prefix`` from ``start_revision`` (0: from now)."""

    @abc.abstractmethod
    async def revision(self) -> int:
        """Current store revision."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Metastore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
