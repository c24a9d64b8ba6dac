"""The plugin against real containerds through CRI (each test once per runtime of the
matrix, see conftest.py): registration, pinning, updates, a crash and restart, a
conflicting second plugin, and pre-launched mode.

No version is written here: what a test expects of a runtime comes from what that runtime
reports (CRI Version, Configure) and from the NRI version its Debian package says it was
built with (``ContainerdEnv.runtime["nri_version"]``).

The ``pinner`` policy on this 2-CPU machine: a Guaranteed container asking for one whole
CPU gets CPU ``1`` exclusively; every other container shares what is left (``0``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import grpc
import pytest
from containerd_env import ContainerdEnv
from containerd_host import cgroup_v1_root
from cri_client import CRIClient, Pod
from nri_framework.nri.versions import parse_version, synchronizes_prelaunched, valid_events

if TYPE_CHECKING:
    from conftest import PluginFactory, PluginProcess

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

SHOW_CPUS = [
    "sh",
    "-c",
    "grep Cpus_allowed_list /proc/self/status; trap 'exit 0' TERM; while true; do sleep 1; done",
]


class CpuRes(TypedDict, total=False):
    cpu_quota: int
    cpu_period: int
    cpu_shares: int


#: one whole CPU, as the kubelet sets it for a Guaranteed pod with ``cpu: 1``
GUARANTEED: CpuRes = {"cpu_quota": 100000, "cpu_period": 100000, "cpu_shares": 1024}
BESTEFFORT: CpuRes = {}


def _q(text: str) -> str:
    """``text`` as it appears inside a quoted logfmt ``msg="..."`` in containerd's log."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def online_cpus() -> str:
    return Path("/sys/devices/system/cpu/online").read_text().strip()


@pytest.fixture(autouse=True)
def _two_cpus() -> None:
    if online_cpus() != "0-1":
        pytest.skip(f"these tests expect CPUs 0-1 online, not {online_cpus()}")


def cpus_of(line: str) -> str:
    """``"Cpus_allowed_list:\\t1"`` -> ``"1"``."""
    assert line.startswith("Cpus_allowed_list:"), line
    return line.split(":", 1)[1].strip()


def cgroup_cpus(pod: Pod, cid: str) -> str | None:
    """The container's cgroup v1 ``cpuset.cpus`` (None without a cpuset hierarchy)."""
    root = cgroup_v1_root("cpuset")
    if root is None:
        return None
    path = root / str(pod.config.linux.cgroup_parent).lstrip("/") / cid / "cpuset.cpus"
    assert path.is_file(), f"no cgroup cpuset file {path}"
    return path.read_text().strip()


def exec_cpus(cri: CRIClient, cid: str, pid: str = "1") -> str:
    """Cpus_allowed_list of the container's PID ``pid`` (``"self"``: a new exec'd process)."""
    r = cri.exec_sync(cid, ["grep", "Cpus_allowed_list", f"/proc/{pid}/status"])
    assert r.exit_code == 0, (r.exit_code, r.stdout, r.stderr)
    return cpus_of(r.stdout.decode().strip())


def observed_cpus(cri: CRIClient, pod: Pod, cid: str) -> dict[str, str | None]:
    """Everything that shows a running container's cpuset, now."""
    return {
        "pid1": exec_cpus(cri, cid, "1"),
        "exec": exec_cpus(cri, cid, "self"),
        "cgroup": cgroup_cpus(pod, cid),
    }


def expect_cpus(cpus: str, got: dict[str, str | None]) -> None:
    want = {k: (cpus if v is not None else None) for k, v in got.items()}
    assert got == want, f"expected cpuset {cpus} everywhere, saw {got}"


def run_container(
    cri: CRIClient, pod_name: str, name: str, res: CpuRes = BESTEFFORT
) -> tuple[Pod, str, str]:
    """A pod with one container that prints its CPUs; returns (pod, id, printed cpus)."""
    pod = cri.run_pod(pod_name)
    cid = cri.create_container(pod.id, pod.config, name, command=SHOW_CPUS, **res)
    cri.start_container(cid)
    return pod, cid, cpus_of(cri.wait_for_output(cid, "Cpus_allowed_list"))


# --------------------------------------------------------------------------- 1


def built_nri(env: ContainerdEnv) -> tuple[int, ...]:
    """The NRI version the runtime's Debian package was built with (Built-Using)."""
    assert env.nri_version, f"no NRI version recorded for {env.cache_dir}: {env.runtime}"
    return env.nri_version


def test_registers_with_containerd(
    plugin: PluginProcess, cri: CRIClient, containerd_env: ContainerdEnv
) -> None:
    ctd = plugin.containerd_log_since_start()
    # containerd (NRI 0.6.1 and 0.8.0), adaptation.go: an external plugin is named
    # "external:<idx>-<name>[<pid>]" until it registers
    m = re.search(
        re.escape(_q('plugin "external:10-pinner['))
        + r"(\d+)"
        + re.escape(_q(']" registered as "10-pinner"')),
        ctd,
    )
    assert m, f"no registration line in containerd's log:\n{ctd[-3000:]}"
    assert int(m.group(1)) == plugin.pid
    assert _q("synchronizing plugin 10-pinner") in ctd
    assert _q('plugin "10-pinner" connected') in ctd
    print(f"\n[containerd] {m.group(0)}")

    log = plugin.log_text()
    assert "registered as 10-pinner" in log
    m2 = re.search(
        r"configured by runtime (\S+) (\S+) \(NRI ([\d.]+)\), subscribed events 0x([0-9a-f]+)",
        log,
    )
    assert m2, log
    name, version, nri, mask_hex = m2.groups()
    mask = int(mask_hex, 16)
    cri_version = cri.version()
    print(
        f"[plugin] runtime {name} {version}, NRI {nri}, events 0x{mask:x}; CRI says "
        f"{cri_version.runtime_name} {cri_version.runtime_version}; Debian's package "
        f"{containerd_env.runtime.get('package_version')} built with NRI "
        f"{containerd_env.runtime.get('nri_version')}"
    )
    # what Configure said is what CRI says, and the NRI we infer is the one it was built with
    assert (name, version) == (cri_version.runtime_name, cri_version.runtime_version)
    assert parse_version(nri) == built_nri(containerd_env)
    valid = valid_events(name, version)
    assert 0 < mask <= valid and not mask & ~valid
    # the pinner decides on create/update/stop and forgets on remove
    for bit in (0x8, 0x80, 0x200, 0x400):  # CREATE, UPDATE, STOP, REMOVE_CONTAINER
        assert mask & bit, f"event bit 0x{bit:x} missing from 0x{mask:x}"
    assert "synchronized 0 pod(s), 0 container(s)" in log
    assert plugin.alive()


# --------------------------------------------------------------------------- 2


def test_guaranteed_and_besteffort_pinning(plugin: PluginProcess, cri: CRIClient) -> None:
    gpod, gid, gcpus = run_container(cri, "guaranteed", "g", GUARANTEED)
    bpod, bid, bcpus = run_container(cri, "besteffort", "b")
    print(f"\n[guaranteed] Cpus_allowed_list: {gcpus}; [besteffort] Cpus_allowed_list: {bcpus}")
    assert gcpus == "1"
    assert bcpus == "0"
    assert cgroup_cpus(gpod, gid) in ("1", None)
    assert cgroup_cpus(bpod, bid) in ("0", None)
    log = plugin.log_text()
    assert "pinner: guaranteed/g gets exclusive CPUs 1" in log, log


# --------------------------------------------------------------------------- 3


def test_update_resources_keeps_pinning(plugin: PluginProcess, cri: CRIClient) -> None:
    pod, cid, cpus = run_container(cri, "upd", "g", GUARANTEED)
    assert cpus == "1"
    expect_cpus("1", observed_cpus(cri, pod, cid))

    cri.update_container_resources(cid, cpuset_cpus="0-1", **GUARANTEED)

    after = observed_cpus(cri, pod, cid)
    print(f"\n[after UpdateContainerResources(cpuset_cpus=0-1)] {after}")
    expect_cpus("1", after)
    # the plugin answered the UpdateContainer request and is still connected
    assert plugin.alive()
    assert "closing plugin" not in plugin.containerd_log_since_start()


# --------------------------------------------------------------------------- 4


def test_sigkill_and_restart_resynchronizes(plugins: PluginFactory, cri: CRIClient) -> None:
    first = plugins.start("pinner", "10", "pinner")
    gpod, gid, gcpus = run_container(cri, "excl", "g", GUARANTEED)
    spod, sid, scpus = run_container(cri, "shared", "s")
    assert (gcpus, scpus) == ("1", "0")
    before = {"g": observed_cpus(cri, gpod, gid), "s": observed_cpus(cri, spod, sid)}
    expect_cpus("1", before["g"])
    expect_cpus("0", before["s"])
    # the snapshot, once the node has been quiet for the host's SAVE_DELAY
    state_file = first.state_dir / "pinner.state.json"
    deadline = time.monotonic() + 10
    while not state_file.is_file():
        assert time.monotonic() < deadline, "no state snapshot once the node was quiet"
        time.sleep(0.05)

    assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    t0 = time.monotonic()
    # containerd drops the dead plugin; creation goes on without it
    npod, nid, ncpus = run_container(cri, "while-dead", "n")
    t_create = time.monotonic() - t0
    print(f"\n[plugin killed] new container created in {t_create:.2f}s, cpus {ncpus}")
    assert ncpus == online_cpus()  # nobody pinned it
    assert first.wait_containerd_dropped(5), first.containerd_log_since_start()[-3000:]

    second = plugins.start("pinner", "10", "pinner", state_dir=first.state_dir)
    log = second.log_text()
    assert re.search(r"loaded state of 2 container\(s\) from .*pinner\.state\.json", log), log
    m = re.search(r"synchronized (\d+) pod\(s\), (\d+) container\(s\), (\d+) update\(s\)", log)
    assert m, log
    print(f"[restarted] {m.group(0)}")
    assert (int(m.group(1)), int(m.group(2))) == (3, 3)

    after = {"g": observed_cpus(cri, gpod, gid), "s": observed_cpus(cri, spod, sid)}
    print(f"[cpusets] before kill {before}\n[cpusets] after resync {after}")
    assert after == before
    # the container made while we were gone joins the shared pool on resync
    expect_cpus("0", observed_cpus(cri, npod, nid))


# --------------------------------------------------------------------------- 5


def test_second_pinning_plugin_conflicts(plugins: PluginFactory, cri: CRIClient) -> None:
    pinner = plugins.start("pinner", "10", "pinner")
    example = plugins.start("example", "20", "example")
    assert "starting policy example" in example.log_text()
    pod = cri.run_pod("conflict")
    with pytest.raises(grpc.RpcError) as exc_info:
        cri.create_container(pod.id, pod.config, "c", command=SHOW_CPUS, **GUARANTEED)
    err = exc_info.value
    text = f"{err.code().name}: {err.details()}"
    print(f"\n[CreateContainer error] {text}")
    assert "both tried to set CPU pinning" in text
    assert '"20-example"' in text and '"10-pinner"' in text
    # a failed creation is not a plugin failure: both stay connected
    time.sleep(0.2)
    assert pinner.alive() and example.alive()
    ctd = pinner.containerd_log_since_start()
    assert "closing plugin" not in ctd, ctd[-3000:]
    assert not cri.list_containers(pod.id)

    # containerd undoes the failed creation towards the plugins (StopContainer +
    # RemoveContainer), so the pinner got CPU 1 back: with the example policy gone the
    # next Guaranteed container gets it (a leak would fail this creation)
    assert example.kill(signal.SIGTERM) == 0
    assert example.wait_containerd_dropped(5)
    _, _, cpus = run_container(cri, "after-conflict", "g", GUARANTEED)
    assert cpus == "1"


# --------------------------------------------------------------------------- 6


def _prelaunch_wrapper(path: Path, *, state_dir: Path, log: Path, pidfile: Path) -> None:
    py = shlex.quote(sys.executable)  # the venv's python, not resolved: keeps the venv
    path.write_text(
        "#!/bin/sh\n"
        "# started by containerd with only NRI_PLUGIN_{NAME,IDX,SOCKET} in the environment\n"
        f"echo $$ > {shlex.quote(str(pidfile))}\n"
        f"PYTHONPATH={shlex.quote(str(REPO / 'framework'))}; export PYTHONPATH\n"
        f"exec {py} -m nri_framework run --policy pinner"
        f" --state-dir {shlex.quote(str(state_dir))} 2>>{shlex.quote(str(log))}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_prelaunched_plugin(containerd_cache: Path, tmp_path: Path) -> None:
    """A dedicated daemon: pre-launched plugins are only started when containerd starts."""
    env = ContainerdEnv(containerd_cache, tmp_path / "ctd")
    log = tmp_path / "prelaunched.log"
    pidfile = tmp_path / "prelaunched.pid"
    conf_text = "hello from 30-prelaunched.conf"
    t0 = time.monotonic()
    try:
        env.start()
        # installed while the daemon runs: nothing happens until it restarts
        _prelaunch_wrapper(
            env.nri_plugin_path / "30-prelaunched",
            state_dir=tmp_path / "state",
            log=log,
            pidfile=pidfile,
        )
        (env.nri_plugin_config_path / "30-prelaunched.conf").write_text(conf_text + "\n")
        time.sleep(0.5)
        assert not log.exists() and not pidfile.exists()

        offset = env.log_path.stat().st_size
        env.restart_daemon()
        # containerd starts pre-launched plugins while it boots and waits for their
        # registration; NRI 0.6.1 (containerd 1.7.24) never sends them Synchronize, so such a
        # plugin never learns of existing containers; NRI 0.7+ (containerd/nri#43; 2.x)
        # synchronizes them like external ones: what containerd logs decides what we expect
        registered = (
            re.escape(_q('plugin "pre-connected:30-prelaunched['))
            + r"(\d+)"
            + re.escape(_q(']" registered as "30-prelaunched"'))
        )
        order = _q('#1: "30-prelaunched" (pre-connected:30-prelaunched[')
        deadline = time.monotonic() + 20
        while True:
            ctd = env.log_path.read_bytes()[offset:].decode(errors="replace")
            m = re.search(registered, ctd)
            if m and order in ctd and log.exists() and "registered as" in log.read_text():
                break
            assert time.monotonic() < deadline, (
                f"pre-launched plugin did not register:\n{ctd[-3000:]}\n--- plugin log:\n"
                + (log.read_text() if log.exists() else "(none)")
            )
            time.sleep(0.05)
        t_up = time.monotonic() - t0
        text = log.read_text()
        print(f"\n[containerd] {m.group(0)}\n[pre-launched] up {t_up:.2f}s after start\n{text}")
        pid = int(pidfile.read_text())
        # the "[pid]" is the socketpair's peer credential: containerd's own pid here
        assert int(m.group(1)) == env.pid, (m.group(1), pid, env.pid)
        print(f"[pids] plugin {pid}, containerd {env.pid}, in containerd's log {m.group(1)}")
        assert re.search(r"starting policy pinner, pre-launched \(fd 3\)", text), text
        assert "registered as 30-prelaunched" in text
        nri = ".".join(map(str, built_nri(env)))
        assert re.search(rf"configured by runtime containerd \S+ \(NRI {re.escape(nri)}\)", text)
        assert f"pinner: ignoring runtime-provided config {conf_text!r}" in text
        # what containerd passed (the shell adds PWD, the wrapper PYTHONPATH): no PATH/HOME
        environ = dict(
            e.decode().split("=", 1)
            for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if e
        )
        assert {k: v for k, v in environ.items() if k.startswith("NRI_")} == {
            "NRI_PLUGIN_NAME": "prelaunched",
            "NRI_PLUGIN_IDX": "30",
            "NRI_PLUGIN_SOCKET": "3",
        }
        assert set(environ) <= {
            "NRI_PLUGIN_NAME",
            "NRI_PLUGIN_IDX",
            "NRI_PLUGIN_SOCKET",
            "PWD",
            "PYTHONPATH",
        }, environ

        with CRIClient(env.cri_socket, log_root=env.pod_log_dir) as cri:
            pod, cid, cpus = run_container(cri, "prelaunched", "g", GUARANTEED)
            assert cpus == "1"
            assert cgroup_cpus(pod, cid) in ("1", None)
            text = log.read_text()
            assert "pinner: prelaunched/g gets exclusive CPUs 1" in text
            ctd = env.log_path.read_bytes()[offset:].decode(errors="replace")
            syncs = _q("synchronizing plugin 30-prelaunched") in ctd
            print(f"[containerd] synchronizes pre-launched plugins: {syncs}")
            # and our table of what each NRI version does agrees with the runtime
            assert syncs == synchronizes_prelaunched(built_nri(env))
            if syncs:
                assert "synchronized 0 pod(s), 0 container(s)" in text, text
            else:
                assert "synchronized" not in text, f"NRI {nri} synchronized a pre-launched plugin?"

            # containerd restarts, the container keeps running, the plugin is launched
            # anew: synchronized (NRI 0.7+) or, never synchronized, it restores what it
            # assigned from its state dir
            time.sleep(0.3)  # the state file is written off the reply path
            first_pid = pid
            log_offset = len(log.read_text())
            env.restart_daemon()
            deadline = time.monotonic() + 20
            while True:
                text = log.read_text()[log_offset:]
                done = "synchronized" if syncs else "restoring"
                if "registered as 30-prelaunched" in text and done in text:
                    break
                assert time.monotonic() < deadline, f"no restart of the plugin:\n{text}"
                time.sleep(0.05)
            assert int(pidfile.read_text()) != first_pid
            print(f"[pre-launched, after containerd restart]\n{text}")
            if syncs:
                assert "synchronized 1 pod(s), 1 container(s)" in text, text
                assert "does not synchronize" not in text, text
            else:
                assert "does not synchronize pre-launched plugins: restoring 1 container(s)" in text
            # the exclusive CPU is still taken: a shared container gets only what is left
            _, _, be_cpus = run_container(cri, "prelaunched-be", "be", BESTEFFORT)
            assert be_cpus == "0", "the restarted plugin forgot the exclusive CPU"
            assert exec_cpus(cri, cid) == "1"
            cri.cleanup()
    finally:
        env.stop()
        if pidfile.exists():
            pid = int(pidfile.read_text())
            # the daemon is gone: the plugin sees EOF and exits; make sure of it
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists() or _zombie_or_gone(pid):
                    break
                time.sleep(0.05)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                pytest.fail(f"pre-launched plugin {pid} outlived containerd")
    assert "lost NRI runtime" in log.read_text()


def _zombie_or_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


# --------------------------------------------------------------------------- 7

BALLOONS_CONFIG = """
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata: {name: default, namespace: kube-system}
spec:
  reservedResources: {cpu: "cpuset:0"}
  balloonTypes:
  - name: dedicated
    matchExpressions: [{key: qosclass, operator: In, values: [Guaranteed]}]
    preferNewBalloons: true
"""


def test_balloons_policy_pins_in_real_containerd(
    plugins: PluginFactory, cri: CRIClient, tmp_path: Path
) -> None:
    """The balloons policy, not just the test policy, against the real runtime:
    the reserved cpuset keeps CPU 0, a Guaranteed container gets a balloon on CPU 1."""
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(BALLOONS_CONFIG)
    proc = plugins.start("balloons", "10", extra_args=("--config-file", str(cfg)))
    _, cid, cpus = run_container(cri, "balloons-g", "g", GUARANTEED)
    assert cpus == "1"
    assert exec_cpus(cri, cid) == "1"
    log = proc.log_text()
    print(f"[balloons] {cpus=}\n{log[-2000:]}")
    assert re.search(r"assigning container default/balloons-g/g to balloon dedicated\[0\]", log)
