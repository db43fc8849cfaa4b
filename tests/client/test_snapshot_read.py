"""``client.read`` / ``read_batches``: the committed table plus the WAL tail.

Real streaming nodes (``tests/node/harness.py``, memory WAL, SQLite), the
real flush job run in-process (``tests/client/reads.py``), pyiceberg reading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from headrace import errors
from headrace.cli.exits import EXIT_USAGE
from headrace.cli.main import main
from headrace.client import HeadraceClient
from headrace.client.reading import AsOf, SnapshotRead
from headrace.client.sync import SyncClient
from headrace.node.errors import STATUS_OF_CODE
from headrace.table import CatalogConfig, TableCatalog, maintenance
from headrace.table.expiry import RetentionOptions
from headrace.table.maintenance import MaintenanceReport, maintain
from headrace.table.pins import pin_epochs_prefix, pins_prefix
from tests.client.reads import flush_now
from tests.node.harness import Cluster

pytestmark = pytest.mark.timeout(300)

T = TypeVar("T")

SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("v", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("vec", pa.list_(pa.float32(), 2)),
    ]
)
EVERYTHING_GOES = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1, orphan_grace_s=0)


def rows(keys: list[int], version: int = 0) -> pa.Table:
    return pa.table(
        {
            "pk": keys,
            "v": [k * 10 + version for k in keys],
            "name": [f"n{k}" for k in keys],
            "vec": [[float(k), float(version)] for k in keys],
        },
        schema=SCHEMA,
    )


def by_key(table: pa.Table) -> dict[int, int]:
    keys = table.column("pk").to_pylist()
    assert len(keys) == len(set(keys)), "a key twice"
    return dict(zip(keys, table.column("v").to_pylist(), strict=True))


@pytest.fixture
async def client(served: Cluster) -> AsyncIterator[HeadraceClient]:
    async with HeadraceClient(served.url, served.keys.cluster) as connected:
        await connected.create_collection("items", SCHEMA, "pk", shards=2)
        yield connected


async def test_reads_the_table_and_the_tail_each_key_once_and_time_travels(
    served: Cluster, client: HeadraceClient, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    async with client.producer() as producer:
        # Nothing flushed yet: the WAL alone.
        first = {k: k * 10 for k in range(20) if k not in (3, 4)}
        await producer.insert("items", rows(list(range(20))))
        deleted = await producer.delete("items", [3, 4])
        assert by_key(await client.read("items")) == {
            k: k * 10 for k in range(20) if k not in (3, 4)
        }
        before_flush = max(r.timetick for r in deleted.results)

        await flush_now(served, client, warehouse, "items")
        # After the flush: the table alone, then the table and a tail that
        # deletes committed rows, re-inserts one and inserts a new version.
        assert by_key(await client.read("items")) == {
            k: k * 10 for k in range(20) if k not in (3, 4)
        }
        await producer.delete("items", [5, 6])
        await producer.insert("items", rows([3, 7, 25], version=1))
        expected = {k: k * 10 for k in range(20) if k not in (4, 5, 6)}
        expected.update({3: 31, 7: 71, 25: 251})
        latest = await client.read("items")
        assert by_key(latest) == expected
        assert latest.schema == SCHEMA

        # Time travel to before the flush: the WAL from its beginning.
        old = await client.read("items", as_of=before_flush)
        assert by_key(old) == first

        # Columns and a filter (over a column not returned, on table and tail rows).
        picked = await client.read("items", columns=["pk"], filter="v > 100 and v < 300")
        assert picked.schema.names == ["pk"]
        assert sorted(picked.column("pk").to_pylist()) == sorted(
            k for k, v in expected.items() if 100 < v < 300
        )

        # The same as batches.
        batches = [b async for b in client.read_batches("items")]
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        assert by_key(pa.Table.from_batches(batches, SCHEMA)) == expected

        # A flush of that tail: the same result from the table alone.
        await flush_now(served, client, warehouse, "items")
        assert by_key(await client.read("items")) == expected
        async with client.snapshot_read("items") as reading:
            assert reading.planned.plan.snapshot_id is not None
            assert by_key(await reading.table()) == expected


async def test_bad_arguments_are_clear_errors(client: HeadraceClient) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"filter": "v >"}, "filter 'v >': does not parse at column"),
        ({"filter": "nope = 3"}, "nope"),
        ({"filter": "name > 3"}, "name"),
        ({"filter": 3}, "Iceberg row-filter string"),
        ({"columns": ["pk", "nope"]}, "no field(s) ['nope']"),
        ({"columns": "pk"}, "list of field names"),
        ({"columns": []}, "none asked for"),
        ({"as_of": -1}, "as_of must be"),
        ({"as_of": "yesterday"}, "as_of must be"),
    ]
    for kwargs, message in cases:
        with pytest.raises(errors.InvalidArgument, match=None) as raised:
            await client.read("items", **kwargs)  # type: ignore[arg-type]
        assert message in str(raised.value), (kwargs, raised.value)
    with pytest.raises(errors.NotFound):
        await client.read("nothing")


async def test_a_long_read_keeps_its_snapshot_across_expiry_and_orphan_collection(
    served: Cluster, client: HeadraceClient, tmp_path: Path
) -> None:
    """Half-way through a batched read, a flush rewrites the files (deletes of
    committed rows) and maintenance expires every old snapshot and deletes
    unreferenced files at once: the read's pin keeps its snapshot's files."""
    warehouse = tmp_path / "warehouse"
    async with client.producer() as producer:
        for start in range(0, 40, 10):
            await producer.insert("items", rows(list(range(start, start + 10))))
            await flush_now(served, client, warehouse, "items")  # a file per flush and shard
        expected = {k: k * 10 for k in range(40)}
        config = CatalogConfig(served.url, str(warehouse), served.keys.cluster)
        with TableCatalog.open(config) as catalog:
            batches = client.read_batches("items")
            first = await anext(batches)
            assert catalog.reader_pins()["items"]
            await producer.delete("items", list(range(40)))
            await flush_now(served, client, warehouse, "items")
            report = await asyncio.to_thread(
                maintain, catalog, "items", EVERYTHING_GOES, catalog.reader_pins()["items"]
            )
            assert report.deleted, "the flush's rewrite left no garbage"
            rest = [b async for b in batches]
            assert by_key(pa.Table.from_batches([first, *rest])) == expected
            assert catalog.reader_pins() == {}, "the pin outlived the read"
            assert by_key(await client.read("items")) == {}


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The exit status (argparse's own usage errors exit with 2), stdout, stderr."""
    try:
        code = await asyncio.to_thread(main, list(argv))
    except SystemExit as exited:
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


async def test_headrace_read_prints_a_table_json_and_writes_parquet(
    served: Cluster, client: HeadraceClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with client.producer() as producer:
        await producer.insert("items", rows([1, 2, 3]))
        await flush_now(served, client, tmp_path / "warehouse", "items")
        await producer.delete("items", [2])
        written = await producer.insert("items", rows([4], version=1))
    where = ["--metastore", served.url, "--cluster", served.keys.cluster, "--collection", "items"]

    code, out, err = await cli(capsys, "read", *where, "--columns", "pk,v")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].split() == ["PK", "V"]
    assert sorted(tuple(line.split()) for line in lines[1:-1]) == [
        ("1", "10"),
        ("3", "30"),
        ("4", "41"),
    ]
    assert lines[-1].startswith("(3 rows as of ")

    as_of = str(written.results[0].timetick - 1)
    code, out, err = await cli(
        capsys, "read", *where, "--as-of", as_of, "--format", "json", "--filter", "pk >= 2"
    )
    assert code == 0, err
    document = json.loads(out)
    assert document["as_of"] == int(as_of) and document["snapshot_id"] is not None
    assert sorted(r["pk"] for r in document["rows"]) == [3]
    assert document["rows"][0]["vec"] == [3.0, 0.0]

    target = tmp_path / "out.parquet"
    code, out, err = await cli(
        capsys, "read", *where, "--format", "parquet", "--output", str(target)
    )
    assert code == 0, err
    assert sorted(pq.read_table(target).column("pk").to_pylist()) == [1, 3, 4]

    for bad, message in [
        (["--filter", "pk >"], "filter 'pk >'"),
        (["--columns", "pk,,v"], "empty field name"),
        (["--format", "parquet"], "needs --output"),
        (["--output", str(tmp_path / "no" / "such" / "dir")], "--output"),
    ]:
        code, out, err = await cli(capsys, "read", *where, *bad)
        assert code == EXIT_USAGE, (bad, out, err)
        assert message in err, (bad, err)
    code, out, err = await cli(capsys, "read", *where, "--as-of", "-3")
    assert code == EXIT_USAGE and "--as-of" in err, err
    code, out, err = await cli(capsys, "read", *where[:-1], "nothing")
    assert code == EXIT_USAGE and "NOT_FOUND" in err and "nothing" in err, err


async def test_the_sync_client_reads_and_closes_a_batched_read_early(
    served: Cluster, client: HeadraceClient, tmp_path: Path
) -> None:
    async with client.producer() as producer:
        await producer.insert("items", rows(list(range(10))))
        await flush_now(served, client, tmp_path / "warehouse", "items")
        await producer.insert("items", rows([10]))
    config = CatalogConfig(served.url, str(tmp_path / "warehouse"), served.keys.cluster)

    def work() -> tuple[dict[int, int], list[int], dict[str, frozenset[int]]]:
        with SyncClient(served.url, served.keys.cluster) as sync, TableCatalog.open(config) as c:
            whole = by_key(sync.read("items", filter="pk >= 5"))
            batches = sync.read_batches("items", columns=["pk"])
            first = next(batches)
            assert c.reader_pins()["items"], "no pin while the read is open"
            batches.close()  # ends the read early: its pin goes at once
            return whole, first.column("pk").to_pylist(), c.reader_pins()

    whole, first, pins = await asyncio.to_thread(work)
    assert whole == {k: k * 10 for k in range(5, 11)}
    assert first and set(first) <= set(range(11))
    assert pins == {}


@dataclasses.dataclass
class PinsDuringMaintenance:
    """Opens a read at the moment maintenance has read the reader pins and
    planned nothing yet (its first ``plan_expiry``), then runs ``meanwhile``
    (say, a flush that makes the read's snapshot old) on the test's loop."""

    client: HeadraceClient
    as_of: AsOf
    loop: asyncio.AbstractEventLoop
    meanwhile: Callable[[], Awaitable[None]] | None = None
    opened: list[SnapshotRead] = dataclasses.field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = maintenance.plan_expiry

        def plan_expiry(
            table: Table, pinned: frozenset[int], now_s: float, options: RetentionOptions
        ) -> maintenance.Expiry | None:
            if not self.opened:
                self.opened.append(self._run(self._open()))
                if self.meanwhile is not None:
                    self._run(self.meanwhile())
            return real(table, pinned, now_s, options)

        monkeypatch.setattr(maintenance, "plan_expiry", plan_expiry)

    async def _open(self) -> SnapshotRead:
        return await self.client.snapshot_read("items", as_of=self.as_of).__aenter__()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)


async def maintain_with_pins_read_first(catalog: TableCatalog) -> MaintenanceReport:
    """A maintenance round as the runner does it, the pins read first, then
    ``maintain``, as of an hour later: every snapshot replaced by then, even
    during the round, is old enough to expire."""

    def run() -> MaintenanceReport:
        pins = catalog.reader_pins().get("items", frozenset())
        return maintain(catalog, "items", EVERYTHING_GOES, pins, now_s=time.time() + 3600)

    return await asyncio.to_thread(run)


async def test_a_time_travel_read_pinning_while_maintenance_plans_keeps_its_snapshot(
    served: Cluster, client: HeadraceClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maintenance reads the pins (none), then a read at an old timetick
    plans and pins the snapshot of the first flush (no longer current), then
    maintenance expires everything unpinned and deletes unreferenced files
    with no grace period: the read still gets every row of its snapshot."""
    warehouse = tmp_path / "warehouse"
    async with client.producer() as producer:
        await producer.insert("items", rows(list(range(10))))
        await flush_now(served, client, warehouse, "items")
        marker = await producer.insert("items", rows([100]))
        as_of = max(r.timetick for r in marker.results)
        await producer.delete("items", list(range(10)))  # the flush rewrites every file
        await flush_now(served, client, warehouse, "items")
    hook = PinsDuringMaintenance(client, as_of, asyncio.get_running_loop())
    hook.install(monkeypatch)
    config = CatalogConfig(served.url, str(warehouse), served.keys.cluster)
    with TableCatalog.open(config) as catalog:
        report = await maintain_with_pins_read_first(catalog)
        (reading,) = hook.opened
        try:
            snapshot = reading.planned.plan.snapshot_id
            assert snapshot is not None
            assert snapshot != catalog.iceberg_table("items").metadata.current_snapshot_id
            assert by_key(await reading.table()) == {k: k * 10 for k in [*range(10), 100]}
            assert snapshot not in report.expired
            assert report.deleted, "the rewrite left no garbage to collect"
        finally:
            await reading.close()
        again = await maintain_with_pins_read_first(catalog)
        assert snapshot in again.expired, "the snapshot outlived its pin"
    assert by_key(await client.read("items")) == {100: 1000}


async def test_a_latest_read_pinning_while_maintenance_plans_survives_a_flush_meanwhile(
    served: Cluster, client: HeadraceClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maintenance reads the pins (none), a "latest" read pins the current
    snapshot, a flush rewriting its files commits, and maintenance, raced by
    the flush, plans again on the new table: the read's snapshot, no longer
    current, keeps its files for the read."""
    warehouse = tmp_path / "warehouse"
    async with client.producer() as producer:
        await producer.insert("items", rows(list(range(10))))
        await flush_now(served, client, warehouse, "items")

        async def rewrite() -> None:
            await producer.delete("items", list(range(5)))
            await flush_now(served, client, warehouse, "items")

        hook = PinsDuringMaintenance(client, "latest", asyncio.get_running_loop(), rewrite)
        hook.install(monkeypatch)
        config = CatalogConfig(served.url, str(warehouse), served.keys.cluster)
        with TableCatalog.open(config) as catalog:
            report = await maintain_with_pins_read_first(catalog)
            (reading,) = hook.opened
            try:
                snapshot = reading.planned.plan.snapshot_id
                assert snapshot is not None
                assert snapshot != catalog.iceberg_table("items").metadata.current_snapshot_id
                assert by_key(await reading.table()) == {k: k * 10 for k in range(10)}
                assert snapshot not in report.expired
            finally:
                await reading.close()
    assert by_key(await client.read("items")) == {k: k * 10 for k in range(5, 10)}


async def test_a_read_whose_pin_lapsed_and_whose_files_were_collected_says_read_again(
    served: Cluster, client: HeadraceClient, tmp_path: Path
) -> None:
    """The read's pin lease runs out (a reader stalled past its TTL: here
    revoked), a flush rewrites every file and expiry collects the read's
    snapshot: the read fails UNAVAILABLE (retryable) naming the pin, the
    snapshot and the missing file, not INVALID_ARGUMENT; reading again works."""
    warehouse = tmp_path / "warehouse"
    async with client.producer() as producer:
        await producer.insert("items", rows(list(range(10))))
        await flush_now(served, client, warehouse, "items")
        config = CatalogConfig(served.url, str(warehouse), served.keys.cluster)
        with TableCatalog.open(config) as catalog:
            async with client.snapshot_read("items") as reading:
                snapshot = reading.planned.plan.snapshot_id
                (pin,) = await served.metastore.get_prefix(pins_prefix(served.keys))
                await served.metastore.revoke_lease(pin.lease)
                await producer.delete("items", list(range(5)))
                await flush_now(served, client, warehouse, "items")
                report = await asyncio.to_thread(maintain, catalog, "items", EVERYTHING_GOES)
                assert snapshot in report.expired and report.deleted
                with pytest.raises(errors.HeadraceError) as raised:
                    await reading.table()
            lost = raised.value
            assert isinstance(lost, errors.Unavailable) and lost.retryable, lost
            assert STATUS_OF_CODE[lost.code] is grpc.StatusCode.UNAVAILABLE
            assert "pin of its snapshot expired" in lost.message
            assert f"snapshot {snapshot} of" in lost.message
            assert "is not in the warehouse directory" in lost.message
    assert by_key(await client.read("items")) == {k: k * 10 for k in range(5, 10)}


async def test_a_file_deleted_by_hand_under_a_held_pin_is_lost_data(
    served: Cluster, client: HeadraceClient, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    async with client.producer() as producer:
        await producer.insert("items", rows(list(range(10))))
        await flush_now(served, client, warehouse, "items")
    async with client.snapshot_read("items") as reading:
        snapshot = reading.planned.plan.snapshot_id
        table = reading.planned.table
        assert table is not None and snapshot is not None
        gone = next(iter(table.scan(snapshot_id=snapshot).plan_files())).file.file_path
        await asyncio.to_thread(Path(gone.removeprefix("file://")).unlink)
        with pytest.raises(errors.HeadraceError) as raised:
            await reading.table()
    lost = raised.value
    assert isinstance(lost, errors.MissingFile) and not lost.retryable, lost
    assert STATUS_OF_CODE[lost.code] is grpc.StatusCode.DATA_LOSS
    assert lost.path == gone and f"snapshot {snapshot} of" in lost.message
    with pytest.raises(errors.MissingFile):
        await client.read("items")


async def test_a_read_that_planned_before_a_drop_neither_pins_nor_leaves_an_epoch(
    served: Cluster, client: HeadraceClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collection is dropped after the read found it live and before it
    read the table pointer: the read is NOT_FOUND, and no pin epoch (the one
    pin key without a lease) is left for the dropped collection."""
    async with client.producer() as producer:
        await producer.insert("items", rows(list(range(4))))
    await flush_now(served, client, tmp_path / "warehouse", "items")
    real = SnapshotRead._as_of

    async def dropped_meanwhile(self: SnapshotRead, pchannels: Sequence[str]) -> int:
        as_of = await real(self, pchannels)
        await client.drop_collection("items")
        return as_of

    monkeypatch.setattr(SnapshotRead, "_as_of", dropped_meanwhile)
    with pytest.raises(errors.NotFound, match="collection items was dropped"):
        await client.read("items")
    assert await served.metastore.get_prefix(pins_prefix(served.keys)) == []
    assert await served.metastore.get_prefix(pin_epochs_prefix(served.keys)) == []
