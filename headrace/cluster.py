"""Cluster state kept in the metastore: key layout and records.

Everything a coordinator, a node and a client share goes through these keys
(``<root>`` is ``/headrace/<cluster name>``)::

    <root>/config                    ClusterConfig JSON (pchannel names)
    <root>/nodes/<node id>           NodeInfo JSON, bound to the node's session lease
    <root>/pchannels/<pchannel>      Assignment JSON, written with compare-and-swap
    <root>/coordinator/leader        coordinator id, bound to its election lease
    <root>/coordinator/term          election term (monotonic)
    <root>/tso                       TSO window upper bound
    <root>/checkpoints/<pchannel>    recovery checkpoint of a pchannel, under its term
    <root>/format                    ClusterFormat JSON: the message format nodes write
    <root>/formats/<pchannel>        LogFormats JSON: message formats written in its log

Assignment protocol (declarative: the coordinator writes, nodes react):

* ``ASSIGNING(node, term)``: the coordinator chose ``node`` under ``term``
  (always greater than every earlier term of the pchannel). The node opens the
  WAL with ``term`` (fencing older writers in the backend), writes the fence,
  then moves the record to ``ASSIGNED`` by compare-and-swap on its revision.
* ``ASSIGNED(node, term)``: the node serves the pchannel.
* ``UNASSIGNING(node, term, target)``: a graceful move. The node stops taking
  appends (NOT_OWNER naming ``target``), finishes in-flight appends, writes a
  final time tick, closes, then moves the record to ``UNASSIGNED``.
* ``UNASSIGNED(term)``: nobody serves; the coordinator assigns again with
  ``term + 1``.
* ``UNAVAILABLE(term)``: no node can take it now (none alive, or frozen).
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Sequence
from typing import Self

import pydantic

from headrace import errors
from headrace.message.formats import DEFAULT_FORMAT, FormatSupport, describe

DEFAULT_CLUSTER = "default"


class AssignmentState(enum.Enum):
    ASSIGNING = "ASSIGNING"
    ASSIGNED = "ASSIGNED"
    UNASSIGNING = "UNASSIGNING"
    UNASSIGNED = "UNASSIGNED"
    UNAVAILABLE = "UNAVAILABLE"


ACTIVE_STATES = frozenset(
    {AssignmentState.ASSIGNING, AssignmentState.ASSIGNED, AssignmentState.UNASSIGNING}
)
"""States in which ``Assignment.node`` holds (or is opening) the WAL under its term."""


class JsonRecord(pydantic.BaseModel):
    """A metastore record: frozen, stored as JSON, CorruptData when malformed."""

    model_config = pydantic.ConfigDict(frozen=True, extra="ignore")

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes) -> Self:
        try:
            return cls.model_validate_json(data)
        except pydantic.ValidationError as exc:
            raise errors.CorruptData(f"malformed {cls.__name__} record: {exc}") from None


class TLSMode(enum.StrEnum):
    """How a node's gRPC server is reached."""

    OFF = "off"
    TLS = "tls"
    MUTUAL = "mutual"
    """TLS with a client certificate required."""


class NodeInfo(JsonRecord):
    node_id: str
    address: str
    """host:port of the node's gRPC server."""
    started_at: float = 0.0
    frozen: bool = False
    """A frozen node receives no new pchannels (e.g. before an upgrade)."""
    version: str = ""
    tls: TLSMode = TLSMode.OFF
    """Whether the node's gRPC server needs TLS, and client certificates."""
    reads: tuple[int, ...] = (DEFAULT_FORMAT,)
    """Message formats the node's release reads (absent in records of releases
    before formats were advertised: those read and wrote format 1 only)."""
    writes: tuple[int, ...] = (DEFAULT_FORMAT,)
    """Message formats the node's release can write."""

    @pydantic.model_validator(mode="after")
    def _consistent_formats(self) -> Self:
        try:
            FormatSupport.of(self.reads, self.writes)
        except errors.InvalidArgument as exc:
            raise ValueError(exc.message) from None
        return self

    @property
    def formats(self) -> FormatSupport:
        """What the node reads and writes."""
        return FormatSupport.of(self.reads, self.writes)


class ClusterFormat(JsonRecord):
    """The message format version the cluster's nodes write (absent: 1)."""

    version: int = pydantic.Field(default=DEFAULT_FORMAT, ge=1)
    previous: int = 0
    """The version before the last switch (0: never switched)."""
    changed_at: float = 0.0
    reason: str = ""
    """Who switched it and why (``headrace format set``, an UpgradePlan)."""


class LogFormats(JsonRecord):
    """The message formats written in one pchannel's log (absent: format 1).

    A node adds the format it is about to write before it writes anything in
    it, so the record always covers the log; formats are only added."""

    written: tuple[int, ...] = (DEFAULT_FORMAT,)

    @property
    def highest(self) -> int:
        return max(self.written, default=DEFAULT_FORMAT)

    def with_format(self, version: int) -> LogFormats:
        return LogFormats(written=tuple(sorted({*self.written, version})))

    def __str__(self) -> str:
        return describe(self.written)


class Assignment(JsonRecord):
    pchannel: str
    state: AssignmentState
    term: int
    node: str = ""
    address: str = ""
    target: str = ""
    """For UNASSIGNING: the node the pchannel moves to, if known."""
    session: int = 0
    """For ASSIGNED: the session lease of the node process that acknowledged
    it. A node key carrying another lease is a restarted process that does not
    serve the pchannel, even if it re-registered before the old key expired."""
    updated_at: float = 0.0
    reason: str = ""
    """For UNAVAILABLE: why no node may take it (e.g. none reads its log's format)."""


class Routing(enum.StrEnum):
    """How a vchannel's name picks its pchannel, recorded in the cluster config.

    A cluster keeps the rule it was created with: changing it would move every
    vchannel to another pchannel and hide its earlier messages.
    """

    CRC32 = "crc32"
    """CRC-32 of the name modulo the pchannel count. CRC-32 is linear, so names
    that differ in a trailing digit (a collection's shards ``c-0`` … ``c-3``)
    fall on few pchannels. The rule of clusters whose config records none."""
    SHARDS = "shards"
    """A name ``<base>-<i>`` (a collection's shard ``i``, or any name ending in
    ``-`` and a decimal number) goes to pchannel ``(h(<base>) + i) mod n``: the
    shards of one collection take consecutive pchannels, so ``n`` shards cover
    ``n`` pchannels. Any other name goes to ``h(name) mod n``. ``h`` is CRC-32
    of the UTF-8 bytes, then MurmurHash3's 32-bit finaliser."""


NEW_CLUSTER_ROUTING = Routing.SHARDS
"""The rule a new cluster is created with."""


class ClusterConfig(JsonRecord):
    pchannels: list[str]
    wal_backend: str = "local"
    routing: Routing = Routing.CRC32
    """Absent in configs written before the rule was recorded: those used CRC-32."""

    def route(self, vchannel: str) -> str:
        return route(vchannel, self.pchannels, self.routing)


class Keys:
    """Key builders for one cluster."""

    def __init__(self, cluster: str = DEFAULT_CLUSTER) -> None:
        if not cluster or "/" in cluster:
            raise errors.InvalidArgument(f"invalid cluster name {errors.quoted(cluster)}")
        self.cluster = cluster
        self.root = f"/headrace/{cluster}"

    @property
    def config(self) -> str:
        return f"{self.root}/config"

    @property
    def nodes(self) -> str:
        return f"{self.root}/nodes/"

    def node(self, node_id: str) -> str:
        return f"{self.nodes}{node_id}"

    @property
    def pchannels(self) -> str:
        return f"{self.root}/pchannels/"

    def pchannel(self, name: str) -> str:
        return f"{self.pchannels}{name}"

    @property
    def leader(self) -> str:
        return f"{self.root}/coordinator/leader"

    @property
    def coordinator_term(self) -> str:
        return f"{self.root}/coordinator/term"

    @property
    def tso(self) -> str:
        return f"{self.root}/tso"

    def checkpoint(self, pchannel: str) -> str:
        return f"{self.root}/checkpoints/{pchannel}"

    @property
    def format(self) -> str:
        return f"{self.root}/format"

    @property
    def log_formats(self) -> str:
        return f"{self.root}/formats/"

    def log_format(self, pchannel: str) -> str:
        return f"{self.log_formats}{pchannel}"


def default_pchannels(count: int, prefix: str = "pchannel") -> list[str]:
    if count < 1:
        raise errors.InvalidArgument(f"need at least one pchannel, got {count}")
    return [f"{prefix}-{i:03d}" for i in range(count)]


def route(vchannel: str, pchannels: Sequence[str], routing: Routing) -> str:
    """The pchannel that carries ``vchannel`` under the cluster's ``routing``.

    The rule is stable and documented (:class:`Routing`): a hash of the
    vchannel's UTF-8 name, modulo the number of pchannels, indexes the pchannel
    list in its configured order. It depends only on the name, the pchannel
    list and the rule recorded in the cluster config, so every client and node
    computes the same answer.
    """
    if not pchannels:
        raise errors.Unavailable("the cluster has no pchannels configured yet")
    if routing is Routing.CRC32:
        return pchannels[zlib.crc32(vchannel.encode()) % len(pchannels)]
    base, dash, index = vchannel.rpartition("-")
    if dash and base and index.isdigit() and len(index) <= 9:
        return pchannels[(mixed_hash(base) + int(index)) % len(pchannels)]
    return pchannels[mixed_hash(vchannel) % len(pchannels)]


def mixed_hash(name: str) -> int:
    """CRC-32 of ``name``'s UTF-8 bytes through MurmurHash3's 32-bit finaliser
    (every input bit affects every output bit)."""
    h = zlib.crc32(name.encode())
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
