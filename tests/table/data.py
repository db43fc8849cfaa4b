"""The rows the table tests write."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
    ]
)


def rows(pks: list[int]) -> pa.Table:
    return pa.table(
        {"pk": pks, "name": [f"n{pk}" for pk in pks], "score": [pk / 2 for pk in pks]},
        schema=SCHEMA,
    )


def expected(pks: list[int]) -> list[tuple[Any, ...]]:
    return sorted((pk, f"n{pk}", pk / 2) for pk in pks)
