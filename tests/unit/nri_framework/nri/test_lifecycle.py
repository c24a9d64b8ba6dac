"""The lifecycle table, fed every (state, event) pair and the orders each NRI version keeps."""

from __future__ import annotations

import itertools

import pytest
from nri_framework.nri.lifecycle import (
    TRANSITIONS,
    Lifecycle,
    LifecycleError,
    LifecycleEvent,
    LifecycleState,
    next_state,
)

S = LifecycleState
E = LifecycleEvent

# The specification, written out as a table independently of the module's
# comprehensions: state, event (by value), next state.
SPEC = """
connecting     RegisterPlugin         registering
registering    RegisterPlugin reply   registered
registering    Configure              configured
registered     Configure              configured
configured     RegisterPlugin reply   configured
synchronizing  RegisterPlugin reply   synchronizing
synchronized   RegisterPlugin reply   synchronized
restored       RegisterPlugin reply   restored
configured     no Synchronize         restored
configured     Synchronize (more)     synchronizing
configured     Synchronize            synchronized
synchronizing  Synchronize (more)     synchronizing
synchronizing  Synchronize            synchronized
restored       Synchronize (more)     synchronizing
restored       Synchronize            synchronized
synchronized   container event        synchronized
synchronized   pod event              synchronized
restored       container event        restored
restored       pod event              restored
registered     UpdateContainers       registered
configured     UpdateContainers       configured
synchronizing  UpdateContainers       synchronizing
synchronized   UpdateContainers       synchronized
restored       UpdateContainers       restored
connecting     Shutdown               closed
registering    Shutdown               closed
registered     Shutdown               closed
configured     Shutdown               closed
synchronizing  Shutdown               closed
synchronized   Shutdown               closed
restored       Shutdown               closed
"""


def parse_spec(text: str) -> dict[tuple[LifecycleState, LifecycleEvent], LifecycleState]:
    table = {}
    for line in text.strip().splitlines():
        state, rest = line.split(maxsplit=1)
        event, after = rest.rsplit(maxsplit=1)
        table[S(state), E(event.strip())] = S(after)
    return table


EXPECTED = parse_spec(SPEC) | {(s, E.CONNECTION_LOST): S.CLOSED for s in S}

PAIRS = list(itertools.product(S, E))


def test_the_table_is_the_specification() -> None:
    assert dict(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s.name}-{e.name}" for s, e in PAIRS])
def test_every_pair(state: LifecycleState, event: LifecycleEvent) -> None:
    lifecycle = Lifecycle(state)
    if (state, event) in EXPECTED:
        assert lifecycle.allowed(event)
        assert lifecycle.apply(event) is EXPECTED[state, event] is lifecycle.state
        return
    assert not lifecycle.allowed(event)
    with pytest.raises(LifecycleError) as err:
        lifecycle.apply(event, "SomeRequest")
    assert str(err.value) == f"SomeRequest is not allowed in state {state.value}"
    assert (err.value.state, err.value.event) == (state, event)
    assert lifecycle.state is state  # a refused event changes nothing


def test_error_names_the_event_without_a_request_name() -> None:
    with pytest.raises(LifecycleError, match=r"^Configure is not allowed in state synchronized$"):
        next_state(S.SYNCHRONIZED, E.CONFIGURE)


def walk(*events: LifecycleEvent) -> list[LifecycleState]:
    lifecycle = Lifecycle()
    return [lifecycle.apply(e) for e in events]


def test_external_plugin_nri_0_6() -> None:
    # containerd 1.7.24: register, Configure, one Synchronize, then events
    states = walk(E.REGISTER, E.REGISTERED, E.CONFIGURE, E.SYNCHRONIZE, E.POD_EVENT)
    assert states[-2:] == [S.SYNCHRONIZED, S.SYNCHRONIZED]


def test_split_synchronize_nri_0_8() -> None:
    states = walk(
        E.REGISTER,
        E.REGISTERED,
        E.CONFIGURE,
        E.SYNCHRONIZE_MORE,
        E.SYNCHRONIZE_MORE,
        E.SYNCHRONIZE,
        E.CONTAINER_EVENT,
    )
    assert states[3:] == [S.SYNCHRONIZING, S.SYNCHRONIZING, S.SYNCHRONIZED, S.SYNCHRONIZED]


def test_no_event_between_split_synchronize_parts() -> None:
    lifecycle = Lifecycle(S.SYNCHRONIZING)
    for event in (E.CONTAINER_EVENT, E.POD_EVENT, E.CONFIGURE, E.NO_SYNCHRONIZE):
        assert not lifecycle.allowed(event)


def test_prelaunched_nri_0_6_is_served_without_synchronize() -> None:
    lifecycle = Lifecycle()
    for event in (E.REGISTER, E.REGISTERED, E.CONFIGURE, E.NO_SYNCHRONIZE):
        lifecycle.apply(event)
    assert lifecycle.state is S.RESTORED
    assert lifecycle.configured and not lifecycle.synchronized
    assert lifecycle.apply(E.CONTAINER_EVENT) is S.RESTORED
    # a runtime whose version was guessed wrong may synchronize after all
    assert lifecycle.apply(E.SYNCHRONIZE) is S.SYNCHRONIZED


def test_configure_before_the_register_reply() -> None:
    # the runtime writes its answer and its Configure from different goroutines
    lifecycle = Lifecycle()
    lifecycle.apply(E.REGISTER)
    assert not lifecycle.registered
    lifecycle.apply(E.CONFIGURE)
    assert lifecycle.registered and lifecycle.configured
    assert lifecycle.apply(E.REGISTERED) is S.CONFIGURED


def test_closed_takes_nothing_but_connection_lost() -> None:
    lifecycle = Lifecycle()
    lifecycle.apply(E.SHUTDOWN)
    assert [e for e in E if lifecycle.allowed(e)] == [E.CONNECTION_LOST]
    assert not (lifecycle.registered or lifecycle.configured or lifecycle.synchronized)
