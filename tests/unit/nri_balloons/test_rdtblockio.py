"""RDT and block I/O classes (``control.rdt``, ``control.blockio``): the effective
class from the annotations with upstream's container/pod scoping, the pod QoS class
as the default, nothing when disabled, and malformed values refused with a warning."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_balloons.config import BlockIOControl, Control, RdtControl
from nri_balloons.configyaml import load_policy
from nri_balloons.features import unimplemented
from nri_balloons.plugin import Balloons
from nri_balloons.rdtblockio import BLOCKIO_CLASS, MAX_CLASS_NAME, RDT_CLASS, with_classes
from nri_framework import convert
from nri_framework.host import PolicyHost
from nri_framework.model import Container, CpuResources, Pod, Resources, RuntimeInfo, cpu_pin
from nri_framework.simulate.sysfs import write_topology

ON = Control(rdt=RdtControl(enable=True), blockio=BlockIOControl(enable=True))
QOS = Control(
    rdt=RdtControl(enable=True, use_pod_qos_as_default_class=True),
    blockio=BlockIOControl(enable=True, use_pod_qos_as_default_class=True),
)
OFF = Control()


def pod(annotations: dict[str, str] | None = None, qos: str = "burstable") -> Pod:
    return Pod(id="p", name="p", namespace="ns", annotations=annotations or {},
               cgroup_parent=f"/kubepods/{qos}/podp")  # fmt: skip


def ctr(name: str = "c", own: Resources | None = None) -> Container:
    return Container(id="c", pod_sandbox_id="p", name=name, resources=own)


def classes(control: Control, p: Pod, c: Container | None = None) -> tuple[str | None, ...]:
    res = with_classes(Resources(), control, p, c or ctr())
    return res.rdt_class, res.blockio_class


def test_unscoped_annotation_sets_the_class() -> None:
    p = pod({RDT_CLASS: "gold", BLOCKIO_CLASS: "slow"})
    assert classes(ON, p) == ("gold", "slow")


def test_container_scope_beats_pod_scope_beats_unscoped() -> None:
    p = pod({
        RDT_CLASS: "unscoped",
        f"{RDT_CLASS}/pod": "pod",
        f"{RDT_CLASS}/container.c": "mine",
        f"{BLOCKIO_CLASS}/pod": "podio",
        f"{BLOCKIO_CLASS}/container.other": "theirs",
    })  # fmt: skip
    assert classes(ON, p) == ("mine", "podio")
    assert classes(ON, p, ctr("other")) == ("pod", "theirs")


def test_keeps_what_the_adjustment_already_holds() -> None:
    res = with_classes(cpu_pin("1-2", "0"), ON, pod({RDT_CLASS: "gold"}), ctr())
    assert res == Resources(cpu=CpuResources(cpus="1-2", mems="0"), rdt_class="gold")


def test_no_annotation_no_class_without_qos_default() -> None:
    assert classes(ON, pod()) == (None, None)


@pytest.mark.parametrize(
    ("qos", "want"),
    [("burstable", "Burstable"), ("besteffort", "BestEffort"), ("", "Guaranteed")],
)
def test_pod_qos_class_is_the_default(qos: str, want: str) -> None:
    p = (
        pod(qos=qos)
        if qos
        else Pod(id="p", name="p", namespace="ns", cgroup_parent="/kubepods/podp")
    )
    assert classes(QOS, p) == (want, want)


def test_annotation_beats_qos_default() -> None:
    assert classes(QOS, pod({BLOCKIO_CLASS: "slow"})) == ("Burstable", "slow")


def test_qos_default_leaves_the_runtimes_own_class() -> None:
    """As upstream (``GetRDTClass() == ""``): a class the runtime already gave the
    container (containerd's own class annotations) is not replaced by the QoS class."""
    own = Resources(rdt_class="from-runtime", blockio_class="from-runtime")
    assert classes(QOS, pod(), ctr(own=own)) == (None, None)


def test_qos_default_needs_enable() -> None:
    half = Control(
        rdt=RdtControl(enable=False, use_pod_qos_as_default_class=True),
        blockio=BlockIOControl(enable=True, use_pod_qos_as_default_class=True),
    )
    assert classes(half, pod()) == (None, "Burstable")


def test_disabled_omits_annotated_classes_with_upstreams_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert classes(OFF, pod({RDT_CLASS: "gold", BLOCKIO_CLASS: "slow"})) == (None, None)
    assert "ns/p/c: RDT class control disabled, omitting class gold" in caplog.text
    assert "ns/p/c: block I/O class control disabled, omitting class slow" in caplog.text


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "empty"),
        ("x" * (MAX_CLASS_NAME + 1), f"{MAX_CLASS_NAME + 1} characters"),
        ("gold\nsilver", "not a class name"),
        ("-gold", "not a class name"),
        ("a b", "not a class name"),
    ],
)
def test_malformed_annotation_is_refused_with_a_warning(
    value: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    p = pod({RDT_CLASS: value, BLOCKIO_CLASS: "ok"})
    assert classes(QOS, p) == (None, "ok")  # no class, not even the QoS default
    assert f"ns/p/c: invalid RDT class annotation {RDT_CLASS}:" in caplog.text
    assert why in caplog.text
    assert len(caplog.text) < 1000  # a huge value is quoted cut


def test_longest_and_goresctrl_root_class_names_are_accepted() -> None:
    assert classes(ON, pod({RDT_CLASS: "system/default"}))[0] == "system/default"
    longest = "a" * MAX_CLASS_NAME
    assert classes(ON, pod({BLOCKIO_CLASS: longest}))[1] == longest


# --- through the policy ----------------------------------------------------------

CONFIG = """
reservedResources: {cpu: "1"}
control:
  rdt: {enable: true, usePodQoSAsDefaultClass: true}
  blockio: {enable: true}
balloonTypes:
- name: app
  namespaces: ["*"]
"""


@pytest.fixture
def host(tmp_path: Path) -> PolicyHost:
    write_topology(tmp_path / "host", "n4c16")
    (tmp_path / "cfg.yaml").write_text(CONFIG)
    h = PolicyHost("balloons", Balloons(), options={"config_file": str(tmp_path / "cfg.yaml")},
                   host_root=str(tmp_path / "host"))  # fmt: skip
    h.configure("", RuntimeInfo(name="containerd", version="2.1.9"))
    h.synchronize([], [])
    return h


def test_create_adjustment_carries_the_classes_on_the_wire(host: PolicyHost) -> None:
    p = pod({f"{BLOCKIO_CLASS}/container.c": "slow"})
    c = Container(id="c", pod_sandbox_id="p", name="c",
                  resources=Resources(cpu=CpuResources(shares=512)))  # fmt: skip
    res = convert.create_result_to_pb(host.create_container(p, c)).adjust.linux.resources
    assert res.rdt_class.value == "Burstable"
    assert res.blockio_class.value == "slow"
    assert res.cpu.cpus  # the pinning is still there


def test_malformed_annotation_does_not_fail_creation(
    host: PolicyHost, caplog: pytest.LogCaptureFixture
) -> None:
    p = pod({BLOCKIO_CLASS: "\x00" * 100_000})
    c = Container(id="c", pod_sandbox_id="p", name="c")
    res = convert.create_result_to_pb(host.create_container(p, c)).adjust.linux.resources
    assert not res.HasField("blockio_class")
    assert res.rdt_class.value == "Burstable"
    assert "invalid block I/O class annotation" in caplog.text


def test_features_warn_about_no_rdt_option() -> None:
    """Partitions are implemented (nri_balloons.rdtpartitions): no warning left."""
    plain = load_policy(CONFIG).spec
    assert unimplemented(plain) == []
    parts = load_policy(
        CONFIG.replace(
            "rdt: {enable: true, usePodQoSAsDefaultClass: true}",
            "rdt: {enable: true, force: true, options: {l3: {optional: true}}, "
            "partitions: {p: {l3Allocation: {all: {unified: '100%'}}}}}",
        )
    ).spec
    assert unimplemented(parts) == []


def test_container_the_policy_leaves_alone_still_gets_its_classes(host: PolicyHost) -> None:
    """As upstream, where every cached container gets its classes: a ``cpu.preserve``
    container gets no pinning from the policy, but its classes."""
    p = pod({"cpu.preserve.resource-policy.nri.io": "true", BLOCKIO_CLASS: "slow"})
    c = Container(id="c", pod_sandbox_id="p", name="c")
    res = convert.create_result_to_pb(host.create_container(p, c)).adjust.linux.resources
    assert res.blockio_class.value == "slow"
    assert res.rdt_class.value == "Burstable"
    assert not res.cpu.cpus


def test_nothing_to_set_leaves_a_preserved_container_unadjusted(tmp_path: Path) -> None:
    write_topology(tmp_path / "host", "n4c16")
    (tmp_path / "cfg.yaml").write_text("reservedResources: {cpu: '1'}\nballoonTypes: [{name: a}]")
    h = PolicyHost("balloons", Balloons(), options={"config_file": str(tmp_path / "cfg.yaml")},
                   host_root=str(tmp_path / "host"))  # fmt: skip
    h.configure("", RuntimeInfo(name="containerd", version="2.1.9"))
    h.synchronize([], [])
    p = pod({"cpu.preserve.resource-policy.nri.io": "true", BLOCKIO_CLASS: "slow"})
    result = h.create_container(p, Container(id="c", pod_sandbox_id="p", name="c"))
    assert result.adjustment is None
