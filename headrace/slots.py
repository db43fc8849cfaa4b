"""Building slotted values on the hot path without their ``__init__``.

The generated ``__init__`` of a frozen dataclass sets each field by name with
``object.__setattr__``; the slot descriptors' own setters do the same in about
half the time. Code that builds one value per message or per batch from parts
already checked (ids, results, buffer entries, batch headers) takes the
setters from here, in one place, instead of each module finding them itself.
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Setter = Callable[[Any, Any], None]


def setters(cls: type, names: Sequence[str] | None = None) -> tuple[Setter, ...]:
    """The ``__set__`` of the slot descriptor of each of ``names`` (by default
    the dataclass fields of ``cls`` in declaration order), found along the MRO.

    Raises TypeError naming the class when a name has no slot descriptor (a
    private ``__name``, which Python renames, or a class without slots), so a
    wrong table fails when the module is imported, not on the first call."""
    if names is None:
        names = [field.name for field in dataclasses.fields(cls)]
    found: list[Setter] = []
    for name in names:
        slot = next(
            (
                klass.__dict__[name]
                for klass in cls.__mro__
                if isinstance(klass.__dict__.get(name), types.MemberDescriptorType)
            ),
            None,
        )
        if slot is None:
            raise TypeError(
                f"{cls.__name__}.{name} is not a slot (slots must be plain attribute "
                "names, not private '__name's, which Python renames)"
            )
        found.append(slot.__set__)
    return tuple(found)


def slot_names(cls: type) -> tuple[str, ...]:
    """Every slot name of ``cls`` and its bases, bases first, once each."""
    out: list[str] = []
    for klass in reversed(cls.__mro__):
        declared = klass.__dict__.get("__slots__", ())
        for name in (declared,) if isinstance(declared, str) else declared:
            if name not in ("__dict__", "__weakref__") and name not in out:
                out.append(name)
    return tuple(out)


def drain(calls: Iterable[object]) -> None:
    """Run an iterator of calls to its end, keeping nothing: ``drain(map(setter,
    objects, values))`` sets a slot on many objects without a Python loop."""
    collections.deque(calls, maxlen=0)
