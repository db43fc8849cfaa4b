"""Append interceptors and the chain that composes them.

An append travels as a batch of :class:`AppendContext` (one per valid
message of one ``append``/``append_many`` call) through the interceptors,
outermost first. Each interceptor gets only pending contexts, may settle some
itself (a dedup hit, a refused message) and passes the rest on with
``call_next``; after ``call_next`` returns every context it passed on is
settled (result or error). The innermost handler is the timetick stage,
which writes to the backend.

Interceptors must not suspend between deciding about a message and passing
it on when the decision depends on shared state that the order of the log
must reflect (the txn interceptor relies on this): the inner stages reach the
appender queue without suspending.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from headrace import errors
from headrace.message.types import Message
from headrace.wal.api import AppendResult


@dataclasses.dataclass(slots=True)
class AppendContext:
    """One message on its way through the chain.

    ``size`` is the message's encoded size as validated; the timetick stage
    encodes the message once, after stamping its timetick and term.
    """

    message: Message
    size: int
    result: AppendResult | None = None
    error: errors.HeadraceError | None = None

    @property
    def settled(self) -> bool:
        return self.result is not None or self.error is not None

    def fail(self, error: errors.HeadraceError) -> None:
        self.error = error


Handler = Callable[[list[AppendContext]], Awaitable[None]]


class Interceptor(Protocol):
    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        """Handle ``batch`` (all pending); pass on the contexts it did not settle."""


def build_chain(interceptors: Sequence[Interceptor], innermost: Handler) -> Handler:
    """Compose ``interceptors`` (outermost first) around ``innermost``."""
    handler = innermost
    for interceptor in reversed(interceptors):
        handler = _bind(interceptor, handler)
    return handler


def _bind(interceptor: Interceptor, call_next: Handler) -> Handler:
    async def handle(batch: list[AppendContext]) -> None:
        if batch:
            await interceptor(batch, call_next)

    return handle
