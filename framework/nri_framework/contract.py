"""The types of the hook contract: what a policy may call on the host, and
the plain data it hands back.

:mod:`nri_framework.hookspecs` names these in its signatures; it imports
this module only under ``TYPE_CHECKING`` (as pytest's ``hookspec.py`` does),
so that the contract depends on no part of the host. The host
(:class:`~nri_framework.host.PolicyHost`) implements :class:`Host`; the
instrumentation endpoint (:mod:`nri_framework.instrumentation`) exports
:class:`MetricFamily` values.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from nri_framework.model import Container, Pod, RuntimeInfo, Update

if TYPE_CHECKING:
    from nri_sst.retry import Obstacle

#: One sample of a :class:`MetricFamily`: its label values (in the order of
#: the family's ``labels``) and its value.
Sample = tuple[tuple[str, ...], float]


class MetricFamily(msgspec.Struct, frozen=True):
    """A policy's metric as plain data: the framework owns ``prometheus_client``.

    :param name: exported as ``nri_policy_<name>_<unit>`` (``balloons`` +
        ``cores`` -> ``nri_policy_balloons_cores``).
    :param help: the ``# HELP`` text.
    :param labels: label names, in exposition order.
    :param samples: ``(label values, value)``; the values line up with ``labels``.
    :param unit: the unit suffix (``""`` for none).
    :param kind: ``gauge`` or ``counter``.
    """

    name: str
    help: str
    labels: tuple[str, ...]
    samples: list[Sample]
    unit: str = ""
    kind: Literal["gauge", "counter"] = "gauge"


class Host(Protocol):
    """What a policy may use of the host it gets in
    :func:`~nri_framework.hookspecs.policy_start`: read-only views of the
    pod/container cache, its settings, and the calls below. Everything else on
    the host object is the framework's."""

    @property
    def policy_name(self) -> str:
        """The name the policy was loaded under (``--policy``)."""
        ...

    @property
    def options(self) -> argparse.Namespace:
        """The parsed command line (every flag; the policy's own are those it
        added in ``policy_addoption``): read them with
        :func:`nri_framework.cmdline.typed_options`."""
        ...

    @property
    def host_root(self) -> str:
        """Where the node's root is mounted: read sysfs under it."""
        ...

    @property
    def state_dir(self) -> Path | None:
        """The state directory (``--state-dir``), ``None`` when state is not kept."""
        ...

    @property
    def log(self) -> logging.Logger:
        """A logger named for the policy (``policy.<name>``)."""
        ...

    @property
    def runtime(self) -> RuntimeInfo:
        """The runtime that configured the plugin (empty before Configure)."""
        ...

    @property
    def pods(self) -> Mapping[str, Pod]:
        """Pod sandboxes the runtime told of, by id."""
        ...

    @property
    def containers(self) -> Mapping[str, Container]:
        """Containers the runtime told of, by id, with the cpusets decided for them."""
        ...

    async def update_containers(self, updates: list[Update]) -> list[Update]:
        """Push updates to the runtime unsolicited; returns the ones that failed.

        Raises :class:`ConnectionError` when no runtime is connected."""
        ...

    def reply_budget(self, wanted: float) -> float:
        """Seconds a hook may spend blocked on its own work: ``wanted``, capped
        by the runtime's request timeout."""
        ...

    def after_reply(self, call: Callable[[], None]) -> None:
        """In a hook that answers a request: ``call`` runs once the answer is
        journaled and written to the runtime (also when the hook raised),
        before the next request is read, so that the runtime does not wait
        for it; elsewhere it runs now. Its exception is logged; the answer
        stands."""
        ...

    def observe(self, plugin: object) -> None:
        """In ``policy_start``: register ``plugin``'s notification hooks (the
        runtime's events it implements are subscribed to; decision hooks
        stay the policy's)."""
        ...

    def changed(self) -> None:
        """The policy's state changed outside a hook's answer: persist it."""
        ...


class Peer(msgspec.Struct, frozen=True):
    """A process the policy works with but not waits for (the SST helper for
    balloons), named by the hook ``policy_peer``: :class:`PeerWatch` looks
    for it while the plugin runs."""

    #: what log lines and ``/healthz`` call it: ``<name> unreachable: <obstacle>``
    name: str
    #: where it listens (``ipc://PATH``)
    endpoint: str
    #: what stands in the way of reaching it now (its socket is missing), or ``None``
    look: Callable[[], Obstacle | None]
