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

# The specification, written out independently of the module's comprehensions.
EXPECTED: dict[tuple[LifecycleState, LifecycleEvent], LifecycleState] = {
    (S.CONNECTING, E.REGISTER): S.REGISTERING,
    (S.REGISTERING, E.REGISTERED): S.REGISTERED,
    (S.REGISTERING, E.CONFIGURE): S.CONFIGURED,
    (S.REGISTERED, E.CONFIGURE): S.CONFIGURED,
    (S.CONFIGURED, E.REGISTERED): S.CONFIGURED,
    (S.SYNCHRONIZING, E.REGISTERED): S.SYNCHRONIZING,
    (S.SYNCHRONIZED, E.REGISTERED): S.SYNCHRONIZED,
    (S.RESTORED, E.REGISTERED): S.RESTORED,
    (S.CONFIGURED, E.NO_SYNCHRONIZE): S.RESTORED,
    (S.CONFIGURED, E.SYNCHRONIZE_MORE): S.SYNCHRONIZING,
    (S.CONFIGURED, E.SYNCHRONIZE): S.SYNCHRONIZED,
    (S.SYNCHRONIZING, E.SYNCHRONIZE_MORE): S.SYNCHRONIZING,
    (S.SYNCHRONIZING, E.SYNCHRONIZE): S.SYNCHRONIZED,
    (S.RESTORED, E.SYNCHRONIZE_MORE): S.SYNCHRONIZING,
    (S.RESTORED, E.SYNCHRONIZE): S.SYNCHRONIZED,
    (S.SYNCHRONIZED, E.CONTAINER_EVENT): S.SYNCHRONIZED,
    (S.SYNCHRONIZED, E.POD_EVENT): S.SYNCHRONIZED,
    (S.RESTORED, E.CONTAINER_EVENT): S.RESTORED,
    (S.RESTORED, E.POD_EVENT): S.RESTORED,
    (S.REGISTERED, E.UPDATE_CONTAINERS): S.REGISTERED,
    (S.CONFIGURED, E.UPDATE_CONTAINERS): S.CONFIGURED,
    (S.SYNCHRONIZING, E.UPDATE_CONTAINERS): S.SYNCHRONIZING,
    (S.SYNCHRONIZED, E.UPDATE_CONTAINERS): S.SYNCHRONIZED,
    (S.RESTORED, E.UPDATE_CONTAINERS): S.RESTORED,
    (S.CONNECTING, E.SHUTDOWN): S.CLOSED,
    (S.REGISTERING, E.SHUTDOWN): S.CLOSED,
    (S.REGISTERED, E.SHUTDOWN): S.CLOSED,
    (S.CONFIGURED, E.SHUTDOWN): S.CLOSED,
    (S.SYNCHRONIZING, E.SHUTDOWN): S.CLOSED,
    (S.SYNCHRONIZED, E.SHUTDOWN): S.CLOSED,
    (S.RESTORED, E.SHUTDOWN): S.CLOSED,
    **{(s, E.CONNECTION_LOST): S.CLOSED for s in S},
}

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
