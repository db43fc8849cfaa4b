"""TickScheduler: one loop, the earliest wake wins, one run at a time per client."""

from __future__ import annotations

import asyncio

from headrace.guarded import TaskFailure
from headrace.wal.ticks import Due, TickScheduler
from tests.node.harness import until


class Client:
    def __init__(self, name: str, again: Due | None = None) -> None:
        self.name = name
        self.again = again
        self.runs = 0
        self.gate: asyncio.Event | None = None
        self.failures: list[TaskFailure] = []
        self.boom = False

    async def run_due(self) -> Due | None:
        self.runs += 1
        if self.boom:
            raise RuntimeError("injected")
        if self.gate is not None:
            await self.gate.wait()
        return self.again

    async def on_task_failure(self, failure: TaskFailure) -> None:
        self.failures.append(failure)


async def test_the_earliest_wake_wins_and_a_later_one_does_not_postpone_it() -> None:
    scheduler = TickScheduler("n")
    client = Client("c")
    scheduler.add(client)
    scheduler.wake(client, Due(0.02, "soon"))
    scheduler.wake(client, Due(3600, "later"))
    await until(lambda: client.runs == 1)
    await asyncio.sleep(0.05)
    assert client.runs == 1 and scheduler.scheduled == 0
    await scheduler.close()


async def test_a_client_due_while_its_work_runs_runs_again_after_it_never_twice_at_once() -> None:
    scheduler = TickScheduler("n")
    client = Client("c")
    client.gate = asyncio.Event()
    scheduler.add(client)
    scheduler.wake(client, Due(0, "now"))
    await until(lambda: client.runs == 1)
    scheduler.wake(client, Due(0, "again"))
    await asyncio.sleep(0.05)
    assert client.runs == 1, "not while the first run is under way"
    client.gate.set()
    await until(lambda: client.runs == 2)
    await scheduler.close()


async def test_a_failed_run_goes_to_its_client_and_a_forgotten_one_is_not_woken() -> None:
    scheduler = TickScheduler("n")
    failing, gone = Client("failing"), Client("gone")
    failing.boom = True
    for client in (failing, gone):
        scheduler.add(client)
        scheduler.wake(client, Due(0.02, "soon"))
    await scheduler.forget(gone)
    await until(lambda: len(failing.failures) == 1)
    assert "injected" in failing.failures[0].describe()
    await asyncio.sleep(0.05)
    assert gone.runs == 0
    await scheduler.close()
