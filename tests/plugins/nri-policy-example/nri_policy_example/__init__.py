"""A policy from outside the distribution: pins every container to the last
online CPU and labels it with an annotation, so tests can tell it ran."""

from __future__ import annotations

from pathlib import Path

from nri_framework import cpuset
from nri_framework.contract import Host
from nri_framework.hookspecs import hookimpl
from nri_framework.model import Adjustment, Container, CreateResult, Pod, cpu_pin

ANNOTATION = "example.nri-policy/decided-by"


class ExamplePolicy:
    __version__ = "1.2.3"

    def __init__(self) -> None:
        self.cpus = ""

    @hookimpl
    def policy_start(self, host: Host) -> None:
        online = cpuset.parse((Path(host.host_root) / "sys/devices/system/cpu/online").read_text())
        self.cpus = str(online.bit_length() - 1)

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        return CreateResult(
            adjustment=Adjustment(annotations={ANNOTATION: "example"}, resources=cpu_pin(self.cpus))
        )
