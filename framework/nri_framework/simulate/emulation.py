"""Which runtime, and which NRI version, the simulator pretends to be."""

from __future__ import annotations

from dataclasses import dataclass

from nri_framework.model import Event
from nri_framework.nri.versions import VALID_EVENTS_V0_6, VALID_EVENTS_V0_10, has_dedicated_rpcs


@dataclass(frozen=True)
class Emulation:
    """The runtime identity and the NRI behaviour that goes with its version.

    The default is Debian's containerd 1.7.24, built with NRI 0.6.1: no
    timeouts or NRI version in ConfigureRequest, no Synchronize paging,
    every event but the three request/response ones over ``StateChange``,
    and subscription bits up to 0x400.
    """

    runtime_name: str = "containerd"
    runtime_version: str = "1.7.24~ds1"
    nri: tuple[int, ...] = (0, 6, 1)

    @property
    def valid_events(self) -> int:
        return VALID_EVENTS_V0_10 if self.nri >= (0, 10) else VALID_EVENTS_V0_6

    @property
    def sends_timeouts(self) -> bool:
        """ConfigureRequest carries registration/request timeouts (v0.7+)."""
        return self.nri >= (0, 7)

    @property
    def splits_sync(self) -> bool:
        """An oversized SynchronizeRequest is sent in ``more=true`` chunks (v0.7+)."""
        return self.nri >= (0, 7)

    @property
    def dedicated_rpcs(self) -> bool:
        """Per-event RPCs first, StateChange on UNIMPLEMENTED (v0.12+)."""
        return has_dedicated_rpcs(self.nri)

    @property
    def nri_version(self) -> str:
        """What goes into ``ConfigureRequest.NRI_version`` (v0.12+), else ``""``."""
        return "v" + ".".join(map(str, self.nri)) if self.nri >= (0, 12) else ""

    def event_name(self, event: Event) -> str:
        """``RUN_POD_SANDBOX`` -> ``RunPodSandbox`` (upstream's ``PrettyName``)."""
        return "".join(part.capitalize() for part in event.name.split("_"))


#: containerd 1.7.24 as Debian ships it (NRI 0.6.1).
CONTAINERD_1_7 = Emulation()
#: a runtime with NRI v0.12 (NRI_version set, timeouts sent, dedicated RPCs).
NRI_V0_12 = Emulation(runtime_name="containerd", runtime_version="2.3.0", nri=(0, 12, 0))
