"""The declared interceptor list and its one lifecycle: capabilities are found
per interceptor and called in the declared order."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from headrace import errors
from headrace.wal.interceptors import stages
from headrace.wal.interceptors.chain import AppendContext, Handler, Interceptors


class Recorder:
    """A plain interceptor that notes what it is asked."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        self.log.append(f"{self.name}:call")
        await call_next(batch)


class Full(Recorder):
    """An interceptor with every optional capability."""

    def __init__(self, name: str, log: list[str], due: float | None) -> None:
        super().__init__(name, log)
        self.due = due

    async def drain(self, write: Handler) -> None:
        self.log.append(f"{self.name}:drain")

    def close(self) -> None:
        self.log.append(f"{self.name}:close")

    def chore_due_s(self) -> float | None:
        return self.due

    async def chore(self, write: Handler) -> None:
        self.log.append(f"{self.name}:chore")

    def tick_properties(self) -> Mapping[str, str]:
        return {"from": self.name, self.name: "1"}

    def stats(self) -> Mapping[str, object]:
        return {f"{self.name}_seen": len(self.log)}


async def _write(batch: list[AppendContext]) -> None:
    return None


async def test_capabilities_are_called_in_the_declared_order_on_those_that_have_them() -> None:
    log: list[str] = []
    a, plain, b = Full("a", log, 5.0), Recorder("plain", log), Full("b", log, 2.0)
    interceptors = Interceptors([a, plain, b], [plain], _write)
    await interceptors.drain(_write)
    interceptors.close()
    await interceptors.chores(_write)
    assert log == ["a:drain", "b:drain", "a:close", "b:close", "a:chore", "b:chore"]
    assert interceptors.chore_due_s() == 2.0
    assert interceptors.tick_properties() == {"from": "b", "a": "1", "b": "1"}
    assert set(interceptors.stats()) == {"a_seen", "b_seen"}


async def test_the_plain_chain_holds_only_the_stages_declared_for_plain_messages() -> None:
    log: list[str] = []
    a, plain, b = Full("a", log, None), Recorder("plain", log), Full("b", log, None)
    interceptors = Interceptors([a, plain, b], [plain], _write)
    batch = [AppendContext.__new__(AppendContext)]
    await interceptors.plain_chain(batch)
    assert log == ["plain:call"]
    await interceptors.chain(batch)
    assert log == ["plain:call", "a:call", "plain:call", "b:call"]
    assert interceptors.chore_due_s() is None


def test_a_plain_stage_must_come_from_the_declared_list() -> None:
    log: list[str] = []
    with pytest.raises(errors.InvalidArgument):
        Interceptors([Recorder("a", log)], [Recorder("stray", log)], _write)


def test_the_declared_stages_in_chain_order() -> None:
    assert [s.name for s in stages.STAGES] == ["backpressure", "lock", "dedup", "txn", "segments"]
    assert [s.name for s in stages.STAGES if s.plain] == ["lock"]
