"""Checks for the generated protobuf modules in nri_framework.pb.

- the checked-in modules match what scripts/genproto.py produces from proto/;
- golden wire bytes for the NRI messages we send (verified against containerd);
- descriptor names, RPC sets, enum values and key field numbers match the NRI
  reference (shared/reference/nri-protocol.md, sections A1 and A4).
"""

from __future__ import annotations

import filecmp
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nri_framework.pb import cri_pb2, nri_pb2, ttrpc_pb2

ROOT = Path(__file__).resolve().parents[4]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

import _tier  # noqa: E402

GENPROTO = ROOT / "scripts" / "genproto.py"
PB_DIR = Path("nri_framework") / "pb"
CHECKED_IN = ROOT / "framework" / PB_DIR

STALE = "generated protobuf modules are stale: run tox -e proto"


# ---------------------------------------------------------------------------
# (a) checked-in code is up to date
# ---------------------------------------------------------------------------


def _generated_files(base: Path) -> set[str]:
    return {p.name for p in base.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")}


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    try:
        importlib.import_module("grpc_tools.protoc")
    except ImportError as exc:  # a tox dependency: under CI this fails
        _tier.unavailable(
            "proto freshness",
            f"grpc_tools (grpcio-tools) not importable, cannot regenerate: {exc}",
            "NRI_PROTO_REQUIRED",
        )

    proc = subprocess.run(
        [sys.executable, str(GENPROTO), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, f"scripts/genproto.py failed:\n{proc.stdout}\n{proc.stderr}"

    fresh_dir = tmp_path / PB_DIR
    fresh = _generated_files(fresh_dir)
    checked_in = _generated_files(CHECKED_IN)
    assert fresh, "scripts/genproto.py produced no files"

    problems = [f"missing: {n}" for n in sorted(fresh - checked_in)]
    problems += [f"not generated: {n}" for n in sorted(checked_in - fresh)]
    problems += [
        f"differs: {n}"
        for n in sorted(fresh & checked_in)
        if not filecmp.cmp(fresh_dir / n, CHECKED_IN / n, shallow=False)
    ]
    assert not problems, STALE + "\n  " + "\n  ".join(problems)


def test_generated_imports_are_package_absolute() -> None:
    text = (CHECKED_IN / "cri_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from nri_framework.pb import cri_pb2" in text
    for name in ("nri_pb2.py", "ttrpc_pb2.py", "cri_pb2.py"):
        src = (CHECKED_IN / name).read_text(encoding="utf-8")
        assert f"'nri_framework.pb.{name[:-3]}'" in src


# ---------------------------------------------------------------------------
# (b) NRI golden bytes and descriptors
# ---------------------------------------------------------------------------


def test_create_container_response_cpu_pinning_golden_bytes() -> None:
    msg = nri_pb2.CreateContainerResponse(
        adjust=nri_pb2.ContainerAdjustment(
            linux=nri_pb2.LinuxContainerAdjustment(
                resources=nri_pb2.LinuxResources(cpu=nri_pb2.LinuxCPU(cpus="1"))
            )
        )
    )
    data = msg.SerializeToString()
    # adjust(1).linux(6).resources(2).cpu(2).cpus(6) = "1", the path containerd applied.
    # (The reference note's "0a 0b 32 09 12 07 12 05 32 03 '1'" mixes the length bytes
    # of a 3-character cpuset with a 1-character value and does not parse; the
    # 3-character form is checked below.)
    assert data == bytes.fromhex("0a09320712051203320131")
    assert nri_pb2.CreateContainerResponse.FromString(data) == msg

    msg.adjust.linux.resources.cpu.cpus = "0-1"
    assert msg.SerializeToString() == bytes.fromhex("0a0b3209120712053203302d31")


def test_container_update_round_trip() -> None:
    upd = nri_pb2.ContainerUpdate(
        container_id="c1",
        linux=nri_pb2.LinuxContainerUpdate(
            resources=nri_pb2.LinuxResources(cpu=nri_pb2.LinuxCPU(cpus="0-1"))
        ),
    )
    data = upd.SerializeToString()
    # container_id(1)="c1", linux(2).resources(1).cpu(2).cpus(6)="0-1"
    assert data == bytes.fromhex("0a02633112090a0712053203302d31")

    back = nri_pb2.ContainerUpdate.FromString(data)
    assert back == upd
    assert back.container_id == "c1"
    assert back.linux.resources.cpu.cpus == "0-1"
    assert not back.ignore_failure

    req = nri_pb2.UpdateContainersRequest(update=[upd])
    assert nri_pb2.UpdateContainersRequest.FromString(req.SerializeToString()).update[0] == upd


def test_optional_wrapper_present_with_zero_value() -> None:
    # An Optional* wrapper set to 0 must stay distinguishable from "unset".
    mem = nri_pb2.LinuxMemory(limit=nri_pb2.OptionalInt64(value=0))
    data = mem.SerializeToString()
    assert data == bytes.fromhex("0a00")
    back = nri_pb2.LinuxMemory.FromString(data)
    assert back.HasField("limit")
    assert not back.HasField("swap")


PLUGIN_RPCS = {
    "Configure": ("ConfigureRequest", "ConfigureResponse"),
    "Synchronize": ("SynchronizeRequest", "SynchronizeResponse"),
    "Shutdown": ("Empty", "Empty"),
    "RunPodSandbox": ("RunPodSandboxRequest", "RunPodSandboxResponse"),
    "UpdatePodSandbox": ("UpdatePodSandboxRequest", "UpdatePodSandboxResponse"),
    "PostUpdatePodSandbox": ("PostUpdatePodSandboxRequest", "PostUpdatePodSandboxResponse"),
    "StopPodSandbox": ("StopPodSandboxRequest", "StopPodSandboxResponse"),
    "RemovePodSandbox": ("RemovePodSandboxRequest", "RemovePodSandboxResponse"),
    "CreateContainer": ("CreateContainerRequest", "CreateContainerResponse"),
    "PostCreateContainer": ("PostCreateContainerRequest", "PostCreateContainerResponse"),
    "StartContainer": ("StartContainerRequest", "StartContainerResponse"),
    "PostStartContainer": ("PostStartContainerRequest", "PostStartContainerResponse"),
    "UpdateContainer": ("UpdateContainerRequest", "UpdateContainerResponse"),
    "PostUpdateContainer": ("PostUpdateContainerRequest", "PostUpdateContainerResponse"),
    "StopContainer": ("StopContainerRequest", "StopContainerResponse"),
    "RemoveContainer": ("RemoveContainerRequest", "RemoveContainerResponse"),
    "StateChange": ("StateChangeEvent", "Empty"),
    "ValidateContainerAdjustment": (
        "ValidateContainerAdjustmentRequest",
        "ValidateContainerAdjustmentResponse",
    ),
}

RUNTIME_RPCS = {
    "RegisterPlugin": ("RegisterPluginRequest", "Empty"),
    "UpdateContainers": ("UpdateContainersRequest", "UpdateContainersResponse"),
}


@pytest.mark.parametrize(("service", "rpcs"), [("Plugin", PLUGIN_RPCS), ("Runtime", RUNTIME_RPCS)])
def test_nri_service_descriptors(service: str, rpcs: dict[str, tuple[str, str]]) -> None:
    pkg = "nri.pkg.api.v1alpha1"
    assert nri_pb2.DESCRIPTOR.package == pkg
    svc = nri_pb2.DESCRIPTOR.services_by_name[service]
    assert svc.full_name == f"{pkg}.{service}"
    got = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in svc.methods}
    want = {name: (f"{pkg}.{i}", f"{pkg}.{o}") for name, (i, o) in rpcs.items()}
    assert got == want
    for m in svc.methods:
        assert not m.client_streaming and not m.server_streaming


def test_only_runtime_and_plugin_services() -> None:
    assert set(nri_pb2.DESCRIPTOR.services_by_name) == {"Runtime", "Plugin"}


def test_event_enum_values() -> None:
    expected = {
        "UNKNOWN": 0,
        "RUN_POD_SANDBOX": 1,
        "STOP_POD_SANDBOX": 2,
        "REMOVE_POD_SANDBOX": 3,
        "CREATE_CONTAINER": 4,
        "POST_CREATE_CONTAINER": 5,
        "START_CONTAINER": 6,
        "POST_START_CONTAINER": 7,
        "UPDATE_CONTAINER": 8,
        "POST_UPDATE_CONTAINER": 9,
        "STOP_CONTAINER": 10,
        "REMOVE_CONTAINER": 11,
        "UPDATE_POD_SANDBOX": 12,
        "POST_UPDATE_POD_SANDBOX": 13,
        "VALIDATE_CONTAINER_ADJUSTMENT": 14,
        "LAST": 15,
    }
    assert dict(nri_pb2.Event.items()) == expected
    # Subscription bit for event e is 1 << (e - 1); all valid events in v0.10+.
    assert (1 << (nri_pb2.LAST - 1)) - 1 == 0x3FFF


def test_container_state_enum_values() -> None:
    assert dict(nri_pb2.ContainerState.items()) == {
        "CONTAINER_UNKNOWN": 0,
        "CONTAINER_CREATED": 1,
        "CONTAINER_PAUSED": 2,
        "CONTAINER_RUNNING": 3,
        "CONTAINER_STOPPED": 4,
    }


# message -> {field name: field number}, from the reference table (A4) / upstream api.proto.
_T = nri_pb2.DESCRIPTOR.message_types_by_name
FIELD_TABLE: dict[str, dict[str, int]] = {
    "RegisterPluginRequest": {"plugin_name": 1, "plugin_idx": 2, "NRI_version": 3},
    "ConfigureRequest": {
        "config": 1,
        "runtime_name": 2,
        "runtime_version": 3,
        "registration_timeout": 4,
        "request_timeout": 5,
        "NRI_version": 6,
    },
    "ConfigureResponse": {"events": 2},
    "SynchronizeRequest": {"pods": 1, "containers": 2, "more": 3},
    "SynchronizeResponse": {"update": 1, "more": 2},
    "CreateContainerResponse": {"adjust": 1, "update": 2, "evict": 3},
    "UpdateContainerRequest": {"pod": 1, "container": 2, "linux_resources": 3},
    "StateChangeEvent": {"event": 1, "pod": 2, "container": 3},
    "UpdatePodSandboxRequest": {"pod": 1, "overhead_linux_resources": 2, "linux_resources": 3},
    "ValidateContainerAdjustmentResponse": {"reject": 1, "reason": 2},
    "PodSandbox": {
        "id": 1,
        "name": 2,
        "uid": 3,
        "namespace": 4,
        "labels": 5,
        "annotations": 6,
        "runtime_handler": 7,
        "linux": 8,
        "pid": 9,
        "ips": 10,
    },
    "LinuxPodSandbox": {
        "pod_overhead": 1,
        "pod_resources": 2,
        "cgroup_parent": 3,
        "cgroups_path": 4,
        "namespaces": 5,
        "resources": 6,
    },
    "Container": {
        "id": 1,
        "pod_sandbox_id": 2,
        "name": 3,
        "state": 4,
        "labels": 5,
        "annotations": 6,
        "args": 7,
        "env": 8,
        "mounts": 9,
        "hooks": 10,
        "linux": 11,
        "pid": 12,
        "rlimits": 13,
        "created_at": 14,
        "started_at": 15,
        "finished_at": 16,
        "exit_code": 17,
        "status_reason": 18,
        "status_message": 19,
        "CDI_devices": 20,
        "user": 21,
        "image": 22,
    },
    "LinuxContainer": {
        "namespaces": 1,
        "devices": 2,
        "resources": 3,
        "oom_score_adj": 4,
        "cgroups_path": 5,
        "io_priority": 6,
        "seccomp_profile": 7,
        "seccomp_policy": 8,
        "sysctl": 9,
        "net_devices": 10,
        "scheduler": 11,
        "rdt": 12,
    },
    "LinuxResources": {
        "memory": 1,
        "cpu": 2,
        "hugepage_limits": 3,
        "blockio_class": 4,
        "rdt_class": 5,
        "unified": 6,
        "devices": 7,
        "pids": 8,
    },
    "LinuxCPU": {
        "shares": 1,
        "quota": 2,
        "period": 3,
        "realtime_runtime": 4,
        "realtime_period": 5,
        "cpus": 6,
        "mems": 7,
    },
    "LinuxMemory": {
        "limit": 1,
        "reservation": 2,
        "swap": 3,
        "kernel": 4,
        "kernel_tcp": 5,
        "swappiness": 6,
        "disable_oom_killer": 7,
        "use_hierarchy": 8,
    },
    "ContainerAdjustment": {
        "annotations": 2,
        "mounts": 3,
        "env": 4,
        "hooks": 5,
        "linux": 6,
        "rlimits": 7,
        "CDI_devices": 8,
        "args": 9,
    },
    "LinuxContainerAdjustment": {
        "devices": 1,
        "resources": 2,
        "cgroups_path": 3,
        "oom_score_adj": 4,
        "io_priority": 5,
        "seccomp_policy": 6,
        "namespaces": 7,
        "sysctl": 8,
        "net_devices": 9,
        "scheduler": 10,
        "rdt": 11,
        "memory_policy": 12,
    },
    "ContainerUpdate": {"container_id": 1, "linux": 2, "ignore_failure": 3},
    "LinuxContainerUpdate": {"resources": 1},
    "ContainerEviction": {"container_id": 1, "reason": 2},
    "KeyValue": {"key": 1, "value": 2},
}


@pytest.mark.parametrize("message", sorted(FIELD_TABLE))
def test_nri_field_numbers(message: str) -> None:
    desc = _T[message]
    assert {f.name: f.number for f in desc.fields} == FIELD_TABLE[message]


def test_optional_wrappers_have_value_field_1() -> None:
    names = [n for n in _T if n.startswith("Optional")]
    assert sorted(names) == sorted(
        [
            "OptionalString",
            "OptionalRepeatedString",
            "OptionalInt",
            "OptionalInt32",
            "OptionalUInt32",
            "OptionalInt64",
            "OptionalUInt64",
            "OptionalBool",
            "OptionalFileMode",
        ]
    )
    for n in names:
        (field,) = _T[n].fields
        assert (field.name, field.number) == ("value", 1)


def test_field_enum_keyword_value_reachable() -> None:
    # `None` is an upstream enum value name; only reachable via Value()/getattr().
    assert nri_pb2.Field.Value("None") == 0
    assert nri_pb2.Field.Name(40) == "MemoryPolicy"


# ---------------------------------------------------------------------------
# (c) ttrpc envelope
# ---------------------------------------------------------------------------


def test_ttrpc_response_without_status_is_just_payload() -> None:
    resp = ttrpc_pb2.Response(payload=b"\x08\x01")
    assert resp.SerializeToString() == b"\x12\x02\x08\x01"
    assert ttrpc_pb2.Response().SerializeToString() == b""
    back = ttrpc_pb2.Response.FromString(b"\x12\x02\x08\x01")
    assert not back.HasField("status")
    assert back.payload == b"\x08\x01"


def test_ttrpc_error_response() -> None:
    resp = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=12, message="method Foo"))
    data = resp.SerializeToString()
    assert data == b"\x0a\x0e\x08\x0c\x12\x0amethod Foo"
    assert ttrpc_pb2.Response.FromString(data).status.code == 12


def test_ttrpc_request_fields() -> None:
    req = ttrpc_pb2.Request(
        service="nri.pkg.api.v1alpha1.Plugin",
        method="Configure",
        payload=b"",
        timeout_nano=2_000_000_000,
        metadata=[ttrpc_pb2.KeyValue(key="containerd-namespace-ttrpc", value="k8s.io")],
    )
    back = ttrpc_pb2.Request.FromString(req.SerializeToString())
    assert back == req
    assert {f.name: f.number for f in ttrpc_pb2.Request.DESCRIPTOR.fields} == {
        "service": 1,
        "method": 2,
        "payload": 3,
        "timeout_nano": 4,
        "metadata": 5,
    }
    assert ttrpc_pb2.Status.DESCRIPTOR.full_name == "ttrpc.Status"
    assert {f.name: f.number for f in ttrpc_pb2.Status.DESCRIPTOR.fields} == {
        "code": 1,
        "message": 2,
        "details": 3,
    }


def test_ttrpc_status_is_wire_compatible_with_google_rpc_status() -> None:
    try:  # googleapis-common-protos: a tox dependency, under CI this fails
        status_pb2 = importlib.import_module("google.rpc.status_pb2")
    except ImportError as exc:
        _tier.unavailable(
            "ttrpc status check",
            f"googleapis-common-protos not installed: {exc}",
            "NRI_PROTO_REQUIRED",
        )
    ours = ttrpc_pb2.Status(code=3, message="bad")
    theirs = status_pb2.Status.FromString(ours.SerializeToString())
    assert (theirs.code, theirs.message) == (3, "bad")
    assert ttrpc_pb2.Status.FromString(theirs.SerializeToString()) == ours


# ---------------------------------------------------------------------------
# CRI subset (e2e client)
# ---------------------------------------------------------------------------


def test_cri_services() -> None:
    assert cri_pb2.DESCRIPTOR.package == "runtime.v1"
    rt = cri_pb2.DESCRIPTOR.services_by_name["RuntimeService"]
    assert rt.full_name == "runtime.v1.RuntimeService"
    assert {
        "Version",
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "PodSandboxStatus",
        "ListPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "ListContainers",
        "ContainerStatus",
        "UpdateContainerResources",
    } <= {m.name for m in rt.methods}
    img = cri_pb2.DESCRIPTOR.services_by_name["ImageService"]
    assert {"ListImages", "ImageStatus"} <= {m.name for m in img.methods}


def test_cri_grpc_stubs_import() -> None:
    from nri_framework.pb import cri_pb2_grpc  # grpcio is a dependency of the project

    assert hasattr(cri_pb2_grpc, "RuntimeServiceStub")
    assert hasattr(cri_pb2_grpc, "ImageServiceStub")


def test_cri_field_numbers() -> None:
    t = cri_pb2.DESCRIPTOR.message_types_by_name

    def nums(name: str) -> dict[str, int]:
        return {f.name: f.number for f in t[name].fields}

    assert nums("LinuxContainerResources") == {
        "cpu_period": 1,
        "cpu_quota": 2,
        "cpu_shares": 3,
        "memory_limit_in_bytes": 4,
        "oom_score_adj": 5,
        "cpuset_cpus": 6,
        "cpuset_mems": 7,
        "hugepage_limits": 8,
        "unified": 9,
        "memory_swap_limit_in_bytes": 10,
    }
    pod = nums("PodSandboxConfig")
    assert {
        k: pod[k]
        for k in (
            "metadata",
            "hostname",
            "log_directory",
            "dns_config",
            "port_mappings",
            "labels",
            "annotations",
            "linux",
        )
    } == {
        "metadata": 1,
        "hostname": 2,
        "log_directory": 3,
        "dns_config": 4,
        "port_mappings": 5,
        "labels": 6,
        "annotations": 7,
        "linux": 8,
    }
    ctr = nums("ContainerConfig")
    assert (
        ctr["metadata"],
        ctr["image"],
        ctr["command"],
        ctr["args"],
        ctr["working_dir"],
        ctr["envs"],
        ctr["mounts"],
        ctr["labels"],
        ctr["annotations"],
        ctr["log_path"],
        ctr["linux"],
    ) == (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 15)
    st = nums("ContainerStatus")
    assert (st["state"], st["exit_code"], st["log_path"], st["resources"]) == (3, 7, 15, 16)
    assert nums("LinuxSandboxSecurityContext")["namespace_options"] == 1
    assert nums("NamespaceOption") == {
        "network": 1,
        "pid": 2,
        "ipc": 3,
        "target_id": 4,
        "userns_options": 5,
    }
    assert cri_pb2.NamespaceMode.Value("NODE") == 2


def test_under_ci_missing_tox_deps_fail(tmp_path: Path) -> None:
    """grpcio-tools and googleapis-common-protos are tox dependencies: where
    they cannot be imported, ``CI=true`` makes their checks fail, not skip."""
    blocked = tmp_path / "blocked"
    for package in ("grpc_tools", "google/rpc"):
        (blocked / package).mkdir(parents=True)
        (blocked / package / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(blocked)}
    tests = ["test_generated_modules_are_up_to_date", "test_ttrpc_status_is_wire_compatible"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", __file__,
         "-k", " or ".join(tests)],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert "2 failed" in text, text
    assert "PROTO FRESHNESS FAILED (CI=true)" in text and "TTRPC STATUS CHECK FAILED" in text


# ---------------------------------------------------------------------------
# kubelet pod-resources v1 (our own podresources.proto)
# ---------------------------------------------------------------------------

# message -> {field name: field number}, from k8s.io/kubelet/pkg/apis/podresources/v1
PODRES_FIELDS: dict[str, dict[str, int]] = {
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    "GetPodResourcesResponse": {"pod_resources": 1},
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
}


@pytest.mark.parametrize("message", sorted(PODRES_FIELDS))
def test_podresources_field_numbers(message: str) -> None:
    from nri_framework.pb import podresources_pb2

    desc = podresources_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in desc.fields} == PODRES_FIELDS[message]


def test_podresources_service_paths() -> None:
    from nri_framework.pb import podresources_pb2

    assert podresources_pb2.DESCRIPTOR.package == "v1"
    svc = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"  # the gRPC path /v1.PodResourcesLister/List
    assert {m.name for m in svc.methods} == {"List", "Get", "GetAllocatableResources"}
