"""Errors cross the wire as the same Headrace types, hints included."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from headrace import errors
from headrace.client import errors as client_errors
from headrace.client.budget import ByteBudget
from headrace.node import errors as node_errors


@pytest.mark.parametrize(
    "error",
    [
        node_errors.NotOwnerAt("moved", owner="node-b", term=7, address="127.0.0.1:5"),
        errors.NotOwner("nobody knows"),
        errors.Fenced("old", term=3, current_term=4),
        errors.Truncated("gone", earliest="local:42"),
        errors.MessageTooLarge("big"),
        errors.InvalidArgument("bad"),
        errors.Unavailable("later"),
        errors.StorageFull("disk"),
        errors.Closed("closed"),
        errors.HeadraceError("boom"),
    ],
)
def test_errors_round_trip_through_proto_and_json(error: errors.HeadraceError) -> None:
    for back in (
        client_errors.from_proto(node_errors.to_proto(error)),
        client_errors.from_json(node_errors.to_json(error)),
    ):
        if isinstance(error, errors.NotOwner):
            assert type(back) is client_errors.NotOwnerAt
        else:
            assert type(back) is type(error)
        assert (back.code, back.message, back.retryable) == (
            error.code,
            error.message,
            error.retryable,
        )
        if isinstance(error, errors.NotOwner):
            assert isinstance(back, client_errors.NotOwnerAt)
            assert (back.owner, back.term) == (error.owner, error.term)
            expected = error.address if isinstance(error, node_errors.NotOwnerAt) else ""
            assert back.address == expected
        if isinstance(error, errors.Fenced):
            assert isinstance(back, errors.Fenced)
            assert (back.term, back.current_term) == (3, 4)
        if isinstance(error, errors.Truncated):
            assert isinstance(back, errors.Truncated) and back.earliest == "local:42"


def test_unknown_and_malformed_wire_errors_are_internal() -> None:
    unknown = client_errors.build("SOMETHING_NEW", "future code")
    assert unknown.code is errors.ErrorCode.INTERNAL and "SOMETHING_NEW" in unknown.message
    malformed = client_errors.from_json("[1, 2]")
    assert malformed.code is errors.ErrorCode.INTERNAL and not malformed.retryable


def test_rpc_errors_without_details_map_by_status() -> None:
    def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "details", None)

    assert isinstance(
        client_errors.from_rpc_error(rpc_error(grpc.StatusCode.UNAVAILABLE), "n"),
        errors.Unavailable,
    )
    assert isinstance(
        client_errors.from_rpc_error(rpc_error(grpc.StatusCode.INVALID_ARGUMENT), "n"),
        errors.InvalidArgument,
    )
    gone = client_errors.from_rpc_error(rpc_error(grpc.StatusCode.UNIMPLEMENTED), "n")
    assert isinstance(gone, errors.Unavailable) and gone.retryable
    assert "does not serve this Headrace call" in str(gone)
    internal = client_errors.from_rpc_error(rpc_error(grpc.StatusCode.DATA_LOSS), "n")
    assert internal.code is errors.ErrorCode.INTERNAL and not internal.retryable
    detailed = grpc.aio.AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(
            ("headrace-error", node_errors.to_json(errors.NotOwner("x", owner="b", term=2)))
        ),
        "x",
        None,
    )
    translated = client_errors.from_rpc_error(detailed, "n")
    assert isinstance(translated, errors.NotOwner) and translated.owner == "b"


async def test_byte_budget_blocks_when_full_and_admits_in_order() -> None:
    budget = ByteBudget(100)
    await budget.acquire(60)
    await budget.acquire(40)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        await budget.acquire(size)
        order.append(name)

    first = asyncio.create_task(take("first", 50))
    second = asyncio.create_task(take("second", 10))
    await asyncio.sleep(0)
    assert order == [] and budget.used == 100
    budget.release(60)
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and budget.used == 100
    budget.release(100)
    await budget.acquire(500)  # larger than the limit: admitted when nothing is in use
    assert budget.used == 500


async def test_byte_budget_cancelled_waiter_gives_way() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    waiter = asyncio.create_task(budget.acquire(5))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    budget.release(10)
    assert budget.used == 0
    await budget.acquire(10)
    assert budget.used == 10
