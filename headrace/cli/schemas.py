"""Collection schemas given on the command line, as JSON (pure).

Two forms, inline or in a file:

* a mapping of field name to type: ``{"pk": "int64", "vector": "list<float32>"}``;
* a list of fields: ``[{"name": "pk", "type": "int64", "nullable": false}, ...]``.

Fields are nullable unless they say ``"nullable": false``, except the primary
key, which is non-nullable unless it says otherwise. Types: ``bool``,
``int8``…``int64``, ``uint8``…``uint64``, ``float16``, ``float32`` (``float``),
``float64`` (``double``), ``string`` (``utf8``), ``large_string``, ``binary``,
``large_binary``, ``date32``, ``timestamp[s|ms|us|ns]``, ``list<T>`` and
``fixed_size_list<T, N>``, also as Arrow prints them (``list<item: float>``,
``fixed_size_list<item: float>[4]``), so ``collections describe`` output reads back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from headrace import errors

_PRIMITIVES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "halffloat": pa.float16(),
    "float32": pa.float32(),
    "float": pa.float32(),
    "float64": pa.float64(),
    "double": pa.float64(),
    "string": pa.string(),
    "utf8": pa.string(),
    "large_string": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
    "date32": pa.date32(),
    "date32[day]": pa.date32(),
    **{f"timestamp[{unit}]": pa.timestamp(unit) for unit in ("s", "ms", "us", "ns")},
}
_LIST = re.compile(r"^list<(?:item: )?(.+)>$")
_FIXED = re.compile(r"^fixed_size_list<(?:item: )?(.+?)(?:,\s*(\d+)>|>\[(\d+)\])$")


def parse_type(text: str) -> pa.DataType:
    """The Arrow type ``text`` names; InvalidArgument listing the known ones if none."""
    name = text.strip()
    primitive = _PRIMITIVES.get(name.lower())
    if primitive is not None:
        return primitive
    fixed = _FIXED.match(name)
    if fixed is not None:
        return pa.list_(parse_type(fixed.group(1)), int(fixed.group(2) or fixed.group(3)))
    listed = _LIST.match(name)
    if listed is not None:
        return pa.list_(parse_type(listed.group(1)))
    raise errors.InvalidArgument(
        f"unknown field type {errors.quoted(text)}; known: {', '.join(_PRIMITIVES)}, "
        "list<T>, fixed_size_list<T, N>"
    )


def parse_schema(text: str, primary_key: str) -> pa.Schema:
    """The schema ``text`` gives: JSON inline (starting with ``{`` or ``[``) or a file's path."""
    source = text.strip()
    if not source.startswith(("{", "[")):
        try:
            source = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise errors.InvalidArgument(
                f"--schema {errors.quoted(text)} is neither JSON nor a readable file: "
                f"{exc.strerror or exc}"
            ) from None
    try:
        spec = json.loads(source)
    except json.JSONDecodeError as exc:
        raise errors.InvalidArgument(f"--schema is not valid JSON: {exc}") from None
    return pa.schema([_field(item, primary_key) for item in _items(spec)])


def _items(spec: Any) -> list[dict[str, Any]]:
    if isinstance(spec, dict):
        return [{"name": name, "type": kind} for name, kind in spec.items()]
    if isinstance(spec, list) and all(isinstance(item, dict) for item in spec):
        return spec
    raise errors.InvalidArgument(
        "--schema must be a JSON object of field name to type, or a list of "
        '{"name": …, "type": …, "nullable": …} objects'
    )


def _field(item: dict[str, Any], primary_key: str) -> pa.Field:
    name, kind = item.get("name"), item.get("type")
    if not isinstance(name, str) or not isinstance(kind, str):
        raise errors.InvalidArgument(
            f"each schema field needs a string name and type, got {errors.quoted(item)}"
        )
    nullable = item.get("nullable", name != primary_key)
    if not isinstance(nullable, bool):
        raise errors.InvalidArgument(f"field {name!r}: nullable must be true or false")
    return pa.field(name, parse_type(kind), nullable=nullable)
