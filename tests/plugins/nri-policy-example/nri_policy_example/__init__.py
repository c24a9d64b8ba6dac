"""A policy from outside the distribution: pins every container to the last
online CPU (or to ``run --policy example --example-cpus LIST``) and labels it
with an annotation, so tests can tell it ran. It also adds a command,
``nri-resource-policy example-info``."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
from nri_framework import cpuset
from nri_framework.cmdline import typed_options
from nri_framework.contract import Host
from nri_framework.hookspecs import hookimpl
from nri_framework.model import Adjustment, Container, CreateResult, Pod, cpu_pin

ANNOTATION = "example.nri-policy/decided-by"
VERSION = "1.2.3"


class ExampleOptions(msgspec.Struct, frozen=True, kw_only=True):
    #: ``--example-cpus``: pin to these CPUs instead of the last online one
    example_cpus: str = ""


class ExamplePolicy:
    __version__ = VERSION

    def __init__(self) -> None:
        self.cpus = ""

    @hookimpl
    def policy_addoption(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("example")
        group.add_argument(
            "--example-cpus", default="", metavar="LIST", help="pin every container to LIST"
        )

    @hookimpl
    def policy_start(self, host: Host) -> None:
        wanted = typed_options(ExampleOptions, host.options).example_cpus
        if wanted:
            self.cpus = cpuset.format(cpuset.parse(wanted))
            return
        online = cpuset.parse((Path(host.host_root) / "sys/devices/system/cpu/online").read_text())
        self.cpus = str(online.bit_length() - 1)

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        return CreateResult(
            adjustment=Adjustment(annotations={ANNOTATION: "example"}, resources=cpu_pin(self.cpus))
        )


def info_main(argv: list[str]) -> int:
    """Say which policy this is: the command of the group ``nri_resource_policy.commands``."""
    parser = argparse.ArgumentParser(prog="nri-resource-policy example-info")
    parser.add_argument("--annotation", action="store_true", help="print the annotation key")
    args = parser.parse_args(argv)
    print(ANNOTATION if args.annotation else f"nri-policy-example {VERSION}")
    return 0
