"""Group commit for backends whose write is one blocking client call.

Append calls queue up; one flush task takes the queued calls (up to a record
and byte bound), writes them with a single call in the writer's executor
thread, and settles every caller with its own slice of the ids. The Kafka and
Pulsar writers share it; a Fenced error is remembered so later appends fail
at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence

from headrace import errors
from headrace.message.ids import MessageID

_Pending = tuple[list[bytes], "asyncio.Future[list[MessageID]]"]


class GroupCommit:
    def __init__(
        self,
        write: Callable[[list[bytes]], Sequence[MessageID]],
        executor: concurrent.futures.Executor,
        *,
        max_records: int = 10_000,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._write = write
        self._executor = executor
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self.fenced: errors.Fenced | None = None

    async def submit(self, batch: list[bytes]) -> list[MessageID]:
        """Write ``batch`` with whatever else is queued; its ids, in order."""
        if self.fenced is not None:
            raise self.fenced
        if not batch:
            return []
        future: asyncio.Future[list[MessageID]] = asyncio.get_running_loop().create_future()
        self._pending.append((batch, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop())
        return await future

    async def drain(self) -> None:
        """Wait until every queued call is settled."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)

    def _take_group(self) -> list[_Pending]:
        group: list[_Pending] = []
        count = size = 0
        while self._pending:
            batch = self._pending[0][0]
            batch_size = sum(map(len, batch))
            if group and (
                count + len(batch) > self._max_records or size + batch_size > self._max_bytes
            ):
                break
            group.append(self._pending.pop(0))
            count += len(batch)
            size += batch_size
        return group

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            group = self._take_group()
            flat = [record for batch, _ in group for record in batch]
            try:
                ids = await loop.run_in_executor(self._executor, self._write, flat)
            except errors.HeadraceError as exc:
                if isinstance(exc, errors.Fenced):
                    self.fenced = exc
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            index = 0
            for batch, future in group:
                if not future.done():
                    future.set_result(list(ids[index : index + len(batch)]))
                index += len(batch)
