"""The stub's and the host's tables of events against what they replace (an
enum call per event, its ``of_container`` property, a hook name formatted per
event): the same answer for every number a runtime may send."""

from __future__ import annotations

from nri_framework import host, stub
from nri_framework.model import Event


def _old_event(number: int) -> Event | None:
    try:
        return Event(number)
    except ValueError:
        return None


def test_event_lookup_as_the_enum() -> None:
    for number in range(-3, 64):
        assert stub._EVENTS.get(number) is _old_event(number)
    assert stub._EVENTS.get(1 << 31) is None


def test_container_events_as_the_property() -> None:
    for event in Event:
        assert (event in stub._OF_CONTAINER) is event.of_container


def test_hook_names_as_formatted() -> None:
    for event in Event:
        assert host.HOOK_NAMES[event] == f"nri_{event.name.lower()}"
