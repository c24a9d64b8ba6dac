"""The NRI plugin lifecycle as a transition table, sans-IO (h11's ``_state.py`` style).

One trunk goes through these states, seen from the plugin's side::

    CONNECTING --RegisterPlugin sent--> REGISTERING --reply--> REGISTERED
    REGISTERING/REGISTERED --Configure--> CONFIGURED
    CONFIGURED --Synchronize(more)--> SYNCHRONIZING --Synchronize(more)--> SYNCHRONIZING
    CONFIGURED/SYNCHRONIZING --Synchronize(last)--> SYNCHRONIZED
    CONFIGURED --no Synchronize (pre-launched, NRI < 0.7)--> RESTORED
    any --Shutdown / connection lost--> CLOSED

Pod and container events (CreateContainer, UpdateContainer, StopContainer,
StateChange, UpdatePodSandbox and the v0.12 dedicated RPCs) are served in
SYNCHRONIZED and RESTORED only: the runtime sends none before it has
synchronized the plugin (``pkg/adaptation`` holds its lock from RegisterPlugin
to the last Synchronize answer), so one that comes earlier is a protocol
error, answered without asking the policy. Our own ``UpdateContainers`` goes
out once the runtime took our registration.

Notes on the order each NRI version keeps (reference ``nri-protocol.md`` A3, A5):

* The runtime calls Configure only after it accepted RegisterPlugin, but its
  answer and the Configure request are written by different goroutines, so
  Configure may arrive before the reply: REGISTERING takes Configure, and a
  late reply changes nothing.
* NRI 0.6 sends pre-launched plugins no Synchronize; v0.7+ (containerd 1.7.26+,
  2.x) does (:func:`~nri_framework.nri.versions.synchronizes_prelaunched`). The
  caller applies :attr:`LifecycleEvent.NO_SYNCHRONIZE` after Configure when no
  Synchronize will come; RESTORED still takes one, in case the guess was wrong.
* A split Synchronize (v0.7+, ``more=true``) is answered part by part; nothing
  else comes in between.

Nothing here does I/O: :func:`next_state` and :class:`Lifecycle` only compute.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class LifecycleState(enum.Enum):
    CONNECTING = "connecting"
    REGISTERING = "registering"
    REGISTERED = "registered"
    CONFIGURED = "configured"
    SYNCHRONIZING = "synchronizing"
    SYNCHRONIZED = "synchronized"
    #: pre-launched on NRI < 0.7: no Synchronize comes, the plugin serves from saved state
    RESTORED = "restored"
    CLOSED = "closed"


class LifecycleEvent(enum.Enum):
    #: we sent Runtime.RegisterPlugin
    REGISTER = "RegisterPlugin"
    #: the runtime answered RegisterPlugin with OK
    REGISTERED = "RegisterPlugin reply"
    CONFIGURE = "Configure"
    #: no Synchronize will come (pre-launched plugin, NRI < 0.7)
    NO_SYNCHRONIZE = "no Synchronize"
    #: one part of a split Synchronize (``more=true``)
    SYNCHRONIZE_MORE = "Synchronize (more)"
    #: a whole Synchronize, or the last part of a split one
    SYNCHRONIZE = "Synchronize"
    #: CreateContainer, UpdateContainer, StopContainer, container StateChange and RPCs
    CONTAINER_EVENT = "container event"
    #: UpdatePodSandbox, pod StateChange and RPCs
    POD_EVENT = "pod event"
    #: we call Runtime.UpdateContainers (unsolicited updates)
    UPDATE_CONTAINERS = "UpdateContainers"
    SHUTDOWN = "Shutdown"
    CONNECTION_LOST = "connection lost"


S = LifecycleState
E = LifecycleEvent

#: The states in which the runtime took our registration and the trunk is open.
_ACCEPTED = (S.REGISTERED, S.CONFIGURED, S.SYNCHRONIZING, S.SYNCHRONIZED, S.RESTORED)
#: The states in which pod and container events are served.
_SERVING = (S.SYNCHRONIZED, S.RESTORED)

TRANSITIONS: Mapping[tuple[LifecycleState, LifecycleEvent], LifecycleState] = {
    (S.CONNECTING, E.REGISTER): S.REGISTERING,
    (S.REGISTERING, E.REGISTERED): S.REGISTERED,
    (S.REGISTERING, E.CONFIGURE): S.CONFIGURED,
    (S.REGISTERED, E.CONFIGURE): S.CONFIGURED,
    # the reply written after the runtime's Configure: nothing changes
    **{(s, E.REGISTERED): s for s in _ACCEPTED if s is not S.REGISTERED},
    (S.CONFIGURED, E.NO_SYNCHRONIZE): S.RESTORED,
    (S.CONFIGURED, E.SYNCHRONIZE_MORE): S.SYNCHRONIZING,
    (S.CONFIGURED, E.SYNCHRONIZE): S.SYNCHRONIZED,
    (S.SYNCHRONIZING, E.SYNCHRONIZE_MORE): S.SYNCHRONIZING,
    (S.SYNCHRONIZING, E.SYNCHRONIZE): S.SYNCHRONIZED,
    (S.RESTORED, E.SYNCHRONIZE_MORE): S.SYNCHRONIZING,
    (S.RESTORED, E.SYNCHRONIZE): S.SYNCHRONIZED,
    **{(s, e): s for s in _SERVING for e in (E.CONTAINER_EVENT, E.POD_EVENT)},
    **{(s, E.UPDATE_CONTAINERS): s for s in _ACCEPTED},
    **{(s, E.SHUTDOWN): S.CLOSED for s in S if s is not S.CLOSED},
    **{(s, E.CONNECTION_LOST): S.CLOSED for s in S},
}
"""``(state, event) -> next state``; a pair not in it is a :class:`LifecycleError`."""


class LifecycleError(Exception):
    """An event the lifecycle does not allow in the current state (a protocol error)."""

    def __init__(self, event: LifecycleEvent, state: LifecycleState, what: str = "") -> None:
        self.event = event
        self.state = state
        self.what = what or event.value
        super().__init__(f"{self.what} is not allowed in state {state.value}")


def next_state(state: LifecycleState, event: LifecycleEvent, what: str = "") -> LifecycleState:
    """The state after ``event``; raises :class:`LifecycleError` for a pair not in
    :data:`TRANSITIONS` (``what`` names the request in the message)."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise LifecycleError(event, state, what) from None


class Lifecycle:
    """The current state of one trunk; :meth:`apply` moves it or raises, leaving it as it was."""

    __slots__ = ("state",)

    def __init__(self, state: LifecycleState = S.CONNECTING) -> None:
        self.state = state

    def allowed(self, event: LifecycleEvent) -> bool:
        return (self.state, event) in TRANSITIONS

    def apply(self, event: LifecycleEvent, what: str = "") -> LifecycleState:
        self.state = next_state(self.state, event, what)
        return self.state

    @property
    def registered(self) -> bool:
        """The runtime took our registration (it answered, or called Configure)."""
        return self.state in _ACCEPTED

    @property
    def configured(self) -> bool:
        return self.state in (S.CONFIGURED, S.SYNCHRONIZING, *_SERVING)

    @property
    def synchronized(self) -> bool:
        return self.state is S.SYNCHRONIZED
