"""Scheduling classes (upstream e2e test17): the type's class, the annotation
override, and the NRI adjustment that carries them."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_balloons.plugin import Balloons
from nri_framework import convert
from nri_framework.host import PolicyHost
from nri_framework.model import Container, CpuResources, IOPriority, Pod, Resources, RuntimeInfo
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.sysfs import write_topology

CONFIG = """
reservedResources: {cpu: "1"}
schedulingClasses:
- {name: realtime, policy: fifo, priority: 42, flags: [reset-on-fork]}
- {name: background, policy: idle, nice: 17, ioClass: be, ioPriority: 6}
balloonTypes:
- name: rt
  schedulingClass: realtime
  namespaces: ["*"]
"""


@pytest.fixture
def host(tmp_path: Path) -> PolicyHost:
    write_topology(tmp_path / "host", "n4c16")
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    h = PolicyHost(
        "balloons",
        Balloons(),
        options={"config_file": str(tmp_path / "cfg.yaml")},
        host_root=str(tmp_path / "host"),
    )
    h.configure("", RuntimeInfo(name="containerd", version="2.2.1"))
    h.synchronize([], [])
    return h


def create(
    host: PolicyHost, i: int, annotations: dict[str, str] | None = None
) -> pb.CreateContainerResponse:
    pod = Pod(id=f"p{i}", name=f"p{i}", namespace="default", annotations=annotations or {},
              cgroup_parent=f"/kubepods/burstable/pod{i}")  # fmt: skip
    ctr = Container(id=f"c{i}", pod_sandbox_id=pod.id, name="c",
                    resources=Resources(cpu=CpuResources(shares=512)))  # fmt: skip
    return convert.create_result_to_pb(host.create_container(pod, ctr))


def test_type_scheduling_class(host: PolicyHost) -> None:
    adj = create(host, 1).adjust.linux
    assert pb.LinuxSchedulerPolicy.Name(adj.scheduler.policy) == "SCHED_FIFO"
    assert adj.scheduler.priority == 42
    assert [pb.LinuxSchedulerFlag.Name(f) for f in adj.scheduler.flags] == [
        "SCHED_FLAG_RESET_ON_FORK"
    ]
    assert not adj.HasField("io_priority")


def test_annotation_overrides_and_sets_io_priority(host: PolicyHost) -> None:
    adj = create(host, 2, {"scheduling-class.resource-policy.nri.io/container.c": "background"})
    linux = adj.adjust.linux
    assert pb.LinuxSchedulerPolicy.Name(linux.scheduler.policy) == "SCHED_IDLE"
    assert linux.scheduler.nice == 17
    back = convert.adjustment_from_pb(adj.adjust)
    assert back.io_priority == IOPriority(io_class="IOPRIO_CLASS_BE", priority=6)


def test_unknown_annotation_class_is_ignored(host: PolicyHost) -> None:
    adj = create(host, 3, {"scheduling-class.resource-policy.nri.io": "nonexistent"})
    assert adj.adjust.linux.scheduler.priority == 42  # the type's class


def test_old_runtime_is_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_topology(tmp_path / "host", "n4c16")
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    h = PolicyHost("balloons", Balloons(), options={"config_file": str(tmp_path / "cfg.yaml")},
                   host_root=str(tmp_path / "host"))  # fmt: skip
    h.configure("", RuntimeInfo(name="containerd", version="1.7.24~ds1"))
    h.synchronize([], [])
    create(h, 1)
    assert "cannot apply scheduling classes" in caplog.text
