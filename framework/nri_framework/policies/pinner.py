"""``pinner``: a small policy for testing the framework.

Containers with a whole number of CPUs in their CFS quota (``quota`` a
multiple of ``period``, as the kubelet sets for Guaranteed pods with integer
CPU limits) get that many exclusive CPUs, highest ids first so CPU 0 stays
shared. Every other container runs on the shared pool: the online CPUs that
no container holds exclusively. When the shared pool changes, the other
shared containers are updated.

The CPUs come from ``<host-root>/sys/devices/system/cpu/online``, or from
``run --policy pinner --cpus LIST`` (its one flag). State (the
exclusive assignments) is persisted by the host; after a restart the policy
keeps every container on the CPUs it had.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import msgspec

from nri_framework import cpuset
from nri_framework.cmdline import typed_options
from nri_framework.contract import Host
from nri_framework.hookspecs import PolicyError, hookimpl
from nri_framework.model import (
    Adjustment,
    Container,
    CreateResult,
    Pod,
    Resources,
    RuntimeInfo,
    Update,
    cpu_pin,
)

__version__ = "0.1.0"

log = logging.getLogger("policy.pinner")


class PinnerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What the command line tells the pinner."""

    #: ``--cpus``: the CPUs to manage instead of the online ones (list format)
    cpus: str = ""


class Pinner:
    def __init__(self) -> None:
        self.online = 0
        self.exclusive: dict[str, int] = {}  # container id -> mask
        self.shared_members: set[str] = set()

    # -- helpers -------------------------------------------------------------

    @property
    def taken(self) -> int:
        mask = 0
        for m in self.exclusive.values():
            mask |= m
        return mask

    @property
    def shared(self) -> int:
        return self.online & ~self.taken

    @staticmethod
    def exclusive_request(container: Container) -> int:
        """Whole CPUs the container asks for exclusively, 0 for a shared container."""
        cpu = container.resources.cpu if container.resources else None
        if cpu is None or not cpu.quota or not cpu.period or cpu.quota <= 0:
            return 0
        if cpu.quota % cpu.period:
            return 0
        return cpu.quota // cpu.period

    def take(self, n: int) -> int:
        free = self.shared
        if free.bit_count() <= n:  # always leave at least one shared CPU
            raise PolicyError(
                f"pinner: cannot allocate {n} exclusive CPU(s): "
                f"only {free.bit_count()} CPU(s) are shared ({cpuset.format(free)})"
            )
        out = 0
        for _ in range(n):
            top = 1 << (free.bit_length() - 1)
            out |= top
            free &= ~top
        return out

    def shared_updates(self, skip: str = "") -> list[Update]:
        cpus = cpuset.format(self.shared)
        return [
            Update(container_id=cid, resources=cpu_pin(cpus))
            for cid in sorted(self.shared_members)
            if cid != skip
        ]

    def release(self, container_id: str) -> list[Update]:
        self.shared_members.discard(container_id)
        if self.exclusive.pop(container_id, None) is None:
            return []
        return self.shared_updates()

    # -- hooks ---------------------------------------------------------------

    @hookimpl
    def policy_addoption(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("pinner")
        group.add_argument(
            "--cpus", default="", help="override the CPUs a policy manages (list format)"
        )

    @hookimpl
    def policy_start(self, host: Host) -> None:
        online_file = Path(host.host_root) / "sys/devices/system/cpu/online"
        override = typed_options(PinnerOptions, host.options).cpus
        text = override if override else online_file.read_text()
        self.online = cpuset.parse(text)
        log.info("pinner: managing CPUs %s", cpuset.format(self.online))

    @hookimpl
    def nri_configure(self, config: str, runtime: RuntimeInfo) -> None:
        if config.strip():
            log.info("pinner: ignoring runtime-provided config %r", config.strip())

    @hookimpl
    def policy_export_state(self) -> Any:
        return {"exclusive": {cid: cpuset.format(m) for cid, m in self.exclusive.items()}}

    @hookimpl
    def nri_synchronize(
        self, pods: list[Pod], containers: list[Container], saved_state: Any
    ) -> list[Update]:
        saved = (saved_state or {}).get("exclusive", {}) if isinstance(saved_state, dict) else {}
        self.exclusive.clear()
        self.shared_members.clear()
        for c in containers:
            n = self.exclusive_request(c)
            if n and c.id in saved:
                self.exclusive[c.id] = cpuset.parse(saved[c.id]) & self.online
            elif n and c.cpus and cpuset.parse(c.cpus).bit_count() == n:
                # no saved state: trust what the runtime reports
                self.exclusive[c.id] = cpuset.parse(c.cpus) & self.online
            else:
                self.shared_members.add(c.id)
        updates = [
            Update(container_id=cid, resources=cpu_pin(cpuset.format(m)))
            for cid, m in sorted(self.exclusive.items())
        ]
        return updates + self.shared_updates()

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        n = self.exclusive_request(container)
        if n:
            mask = self.take(n)
            self.exclusive[container.id] = mask
            log.info(
                "pinner: %s/%s gets exclusive CPUs %s",
                pod.name,
                container.name,
                cpuset.format(mask),
            )
            return CreateResult(
                adjustment=Adjustment(resources=cpu_pin(cpuset.format(mask))),
                updates=self.shared_updates(),
            )
        self.shared_members.add(container.id)
        return CreateResult(adjustment=Adjustment(resources=cpu_pin(cpuset.format(self.shared))))

    @hookimpl
    def nri_update_container(
        self, pod: Pod, container: Container, resources: Resources
    ) -> list[Update]:
        mask = self.exclusive.get(container.id)
        if mask is None:
            mask = self.shared
        return [Update(container_id=container.id, resources=cpu_pin(cpuset.format(mask)))]

    @hookimpl
    def nri_stop_container(self, pod: Pod, container: Container) -> list[Update]:
        return self.release(container.id)

    @hookimpl
    def nri_remove_container(self, pod: Pod, container: Container) -> None:
        self.release(container.id)


def plugin() -> Pinner:
    """Entry-point target: a fresh policy instance."""
    return Pinner()
