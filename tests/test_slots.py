"""headrace.slots: the one place that finds slot setters for hot-path builders."""

from __future__ import annotations

import dataclasses

import pytest

from headrace import slots


@dataclasses.dataclass(frozen=True, slots=True)
class _Pair:
    left: int
    right: str = "r"


class _Base:
    __slots__ = ("a",)


class _Child(_Base):
    __slots__ = ("b",)


def test_setters_follow_the_dataclass_fields_and_build_an_equal_value() -> None:
    set_left, set_right = slots.setters(_Pair)
    built = object.__new__(_Pair)
    set_left(built, 1)
    set_right(built, "x")
    assert built == _Pair(1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.left = 2  # type: ignore[misc]


def test_setters_find_slots_of_bases_and_slot_names_list_them_bases_first() -> None:
    assert slots.slot_names(_Child) == ("a", "b")
    set_a, set_b = slots.setters(_Child, ("a", "b"))
    child = _Child()
    slots.drain(map(set_a, [child], [7]))
    set_b(child, 8)
    assert (child.a, child.b) == (7, 8)


@pytest.mark.parametrize("name", ["missing", "__hidden"])
def test_a_name_without_a_slot_is_refused_naming_the_class(name: str) -> None:
    with pytest.raises(TypeError, match=f"_Child.{name} is not a slot"):
        slots.setters(_Child, ("a", name))
