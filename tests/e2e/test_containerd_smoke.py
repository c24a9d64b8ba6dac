"""Smoke test of the e2e environment itself: real containerd + CRI, no NRI plugin."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from containerd_env import ContainerdEnv
from containerd_host import RUN_CONTAINERD, _cgroup_dirs

pytestmark = pytest.mark.e2e

SHOW_CPUS = [
    "sh",
    "-c",
    "grep Cpus_allowed_list /proc/self/status; trap 'exit 0' TERM; while :; do sleep 1; done",
]


def _online_cpus() -> str:
    return Path("/sys/devices/system/cpu/online").read_text().strip()


def test_containerd_env_lifecycle(containerd_cache: Path, tmp_path: Path) -> None:
    """Own env: start, pod + container through CRI, output back, stop, nothing left."""
    from cri_client import CRIClient

    run_existed = RUN_CONTAINERD.exists()
    cgroups_before = set(_cgroup_dirs())
    env = ContainerdEnv(containerd_cache, tmp_path / "ctd")
    t0 = time.monotonic()
    try:
        env.start()
        t_start = time.monotonic() - t0
        log = env.log_text()
        assert "created NRI interface" in log, log[-3000:]
        assert 'Registered namespace \\"k8s.io\\" with NRI' in log, log[-3000:]
        assert env.nri_socket.is_socket()

        with CRIClient(env.cri_socket, log_root=env.pod_log_dir) as cri:
            assert cri.version().runtime_name == "containerd"
            assert cri.image_status("registry.k8s.io/pause:3.8") is not None
            uid = "smoke-uid-0001"
            pod = cri.run_pod(
                "smoke",
                "default",
                uid,
                annotations={"a": "b"},
                labels={"app": "smoke"},
                cgroup_parent=f"/kubepods/pod{uid}",
            )
            cid = cri.create_container(
                pod.id,
                pod.config,
                "busybox",
                command=SHOW_CPUS,
                cpu_shares=512,
                cpu_quota=50000,
                cpu_period=100000,
                memory_limit=64 << 20,
            )
            cri.start_container(cid)
            line = cri.wait_for_output(cid, "Cpus_allowed_list")
            assert line.split(":", 1)[1].strip() == _online_cpus()
            assert cri.container_status(cid).state == 1  # CONTAINER_RUNNING
            # the container really is in the cgroup CRI asked for
            cg = Path("/sys/fs/cgroup/cpu/kubepods") / f"pod{uid}" / cid
            assert (cg / "cpu.shares").read_text().strip() == "512"
            assert (cg / "cpu.cfs_quota_us").read_text().strip() == "50000"
            t_pod = time.monotonic() - t0 - t_start
            print(f"\n[smoke] start {t_start:.2f}s, pod+container+output {t_pod:.2f}s")
            cri.stop_container(cid, timeout=5)
            cri.remove_container(cid)
            cri.stop_pod(pod.id)
            cri.remove_pod(pod.id)
            # a second pod is left running on purpose: stop() must clean it up
            pod2 = cri.run_pod("leftover", "default", "smoke-uid-0002")
            c2 = cri.create_container(pod2.id, pod2.config, "sleeper", command=["sleep", "3600"])
            cri.start_container(c2)
    finally:
        env.stop()

    left = {k: v for k, v in env.leftovers().items() if v}
    assert not left, left
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(env.work_dir) not in mounts
    assert set(_cgroup_dirs()) <= cgroups_before
    if not run_existed:
        assert not RUN_CONTAINERD.exists(), os.listdir(RUN_CONTAINERD)


def test_session_fixtures(containerd_env: ContainerdEnv, cri) -> None:  # type: ignore[no-untyped-def]
    """The shared fixtures: ``containerd_env`` (session) and ``cri`` (per test)."""
    assert "created NRI interface" in containerd_env.log_text()
    pod = cri.run_pod("fixture-pod")
    cid = cri.create_container(pod.id, pod.config, "c", command=SHOW_CPUS, cpuset_cpus="0")
    cri.start_container(cid)
    assert cri.wait_for_output(cid, "Cpus_allowed_list").split(":", 1)[1].strip() == "0"
    cri.update_container_resources(cid, cpuset_cpus=_online_cpus(), cpu_shares=256)
    st = cri.container_status(cid)
    assert st.resources.linux.cpuset_cpus == _online_cpus()
    # cri.cleanup() in the fixture's teardown removes the pod
