"""What NRI 0.8 (containerd 2.1) sends that NRI 0.6.1 (containerd 1.7) does not, on the
real runtimes of the matrix; each test runs on both and expects, of each runtime, what the
NRI its Debian package was built with does (``ContainerdEnv.nri_version``):

* the runtime's timeouts in Configure (0.7+), honoured by the plugin (logged, and the
  reply path's budget is a share of the request timeout); 0.6.1 sends none;
* a Synchronize split into several messages with ``more`` (0.7+) when the runtime's
  containers do not fit one ttrpc message (4 MiB); 0.6.1 cannot synchronize them at all;
* a CreateContainer of about a MiB (env and annotations) is handled on both.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import PluginFactory, PluginProcess
from containerd_env import ContainerdEnv
from cri_client import CRIClient

pytestmark = pytest.mark.e2e

SHOW_CPUS = [
    "sh",
    "-c",
    "grep Cpus_allowed_list /proc/self/status; trap 'exit 0' TERM; while true; do sleep 1; done",
]
GUARANTEED = {"cpu_quota": 100000, "cpu_period": 100000, "cpu_shares": 1024}


def _q(text: str) -> str:
    """``text`` as it appears inside a quoted logfmt ``msg="..."`` in containerd's log."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def nri_of(env: ContainerdEnv) -> tuple[int, ...]:
    assert env.nri_version, f"no NRI version recorded for {env.cache_dir}: {env.runtime}"
    return env.nri_version


def cpus_of(line: str) -> str:
    assert line.startswith("Cpus_allowed_list:"), line
    return line.split(":", 1)[1].strip()


@pytest.fixture(autouse=True)
def _two_cpus() -> None:
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    if online != "0-1":
        pytest.skip(f"these tests expect CPUs 0-1 online, not {online}")


# --------------------------------------------------------------------------- timeouts


def test_runtime_timeouts_are_honoured(containerd_cache: Path, tmp_path: Path) -> None:
    """A daemon of its own with a short ``plugin_request_timeout`` (300 ms) and
    ``plugin_registration_timeout`` (3 s): on NRI 0.7+ the plugin logs what the runtime
    sent and caps its reply path at a quarter of it; NRI 0.6.1 sends nothing (the plugin
    says it assumes NRI's defaults). Either way it answers in time: pinned, not dropped."""
    env = ContainerdEnv(
        containerd_cache, tmp_path / "ctd", request_timeout="300ms", registration_timeout="3s"
    )
    factory = PluginFactory(env, tmp_path / "plugins")
    problems: list[str] = []
    try:
        env.start()
        plugin = factory.start("pinner", "10", "pinner")
        log = plugin.log_text()
        line = next((ln for ln in log.splitlines() if "timeouts" in ln), "")
        print(f"\n[{env.runtime.get('id')}] {line.partition(': ')[2] or line}")
        if nri_of(env) >= (0, 7):
            assert (
                "runtime timeouts: registration 3000 ms, request 300 ms; "
                "a reply's blocking work is capped at 75 ms"
            ) in log, log
        else:
            assert re.search(
                r"runtime containerd \S+ sent no timeouts \(NRI < 0\.7\): assuming NRI's "
                r"defaults, registration 5000 ms, request 2000 ms",
                log,
            ), log
        with CRIClient(env.cri_socket, log_root=env.pod_log_dir) as cri:
            pod = cri.run_pod("timeouts")
            cid = cri.create_container(pod.id, pod.config, "g", command=SHOW_CPUS, **GUARANTEED)
            cri.start_container(cid)
            assert cpus_of(cri.wait_for_output(cid, "Cpus_allowed_list")) == "1"
            ctd = plugin.containerd_log_since_start()
            assert "closing plugin" not in ctd, ctd[-3000:]
            assert plugin.alive()
            cri.cleanup()
    finally:
        problems = factory.stop_all()
        env.stop()
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- big messages

#: one container's annotations: 100 x 4000 bytes (400 kB); 12 of them do not fit the
#: 4 MiB of one ttrpc message
ANNOTATIONS = {f"example.com/blob-{i:03d}": chr(ord("a") + i % 26) * 4000 for i in range(100)}
CONTAINERS = 12


def test_synchronize_split_into_messages(
    plugins: PluginFactory, cri: CRIClient, containerd_env: ContainerdEnv
) -> None:
    """12 running containers of 400 kB of annotations each (4.8 MB), then the plugin
    connects. NRI 0.7+ splits the Synchronize (``more``); the plugin answers every part
    but the last with ``more`` and gets the whole. NRI 0.6.1 cannot send it: containerd
    logs that it failed to synchronize the plugin and leaves it out; the plugin refuses
    the one 4.8 MB frame's message and lives on."""
    ids = []
    for i in range(CONTAINERS):
        pod = cri.run_pod(f"big-{i:02d}")
        cid = cri.create_container(
            pod.id, pod.config, "c", command=SHOW_CPUS, annotations=ANNOTATIONS
        )
        cri.start_container(cid)
        ids.append(cid)
    for cid in ids:
        assert cpus_of(cri.wait_for_output(cid, "Cpus_allowed_list")) == "0-1"
    plugin = plugins.start("pinner", "10", "pinner", wait=False)
    ctd_sync = _q("synchronizing plugin 10-pinner")
    if nri_of(containerd_env) >= (0, 7):
        plugin.wait_ready()
        m = re.search(
            r"synchronized (\d+) pod\(s\), (\d+) container\(s\), (\d+) update\(s\), "
            r"in (\d+) messages",
            plugin.log_text(),
        )
        assert m, plugin.log_text()[-3000:]
        print(f"\n[{containerd_env.runtime.get('id')}] {m.group(0)}")
        pods, containers, _updates, messages = map(int, m.groups())
        assert (pods, containers) == (CONTAINERS, CONTAINERS)
        assert messages >= 2
        ctd = plugin.containerd_log_since_start()
        assert ctd_sync in ctd and "closing plugin" not in ctd, ctd[-3000:]
        # in, and pinning: a new Guaranteed container gets CPU 1
        pod = cri.run_pod("after-split-sync")
        cid = cri.create_container(pod.id, pod.config, "g", command=SHOW_CPUS, **GUARANTEED)
        cri.start_container(cid)
        assert cpus_of(cri.wait_for_output(cid, "Cpus_allowed_list")) == "1"
    else:
        failed = _q("failed to synchronize plugin")
        plugin.wait_for(
            lambda: failed in plugin.containerd_log_since_start(), "containerd's sync failure"
        )
        line = next(ln for ln in plugin.containerd_log_since_start().splitlines() if failed in ln)
        print(f"\n[{containerd_env.runtime.get('id')}] {line[-300:]}")
        # NRI 0.6.1 sends the whole 4.8 MB in one mux frame: the plugin takes it in
        # as it comes, refuses the message (over ttrpc's 4 MiB) with RESOURCE_EXHAUSTED,
        # as a Go plugin does, and stays connected (no crash loop), unsynchronized
        refused = "RESOURCE_EXHAUSTED: message length"
        plugin.wait_for(lambda: refused in plugin.log_text(), "the plugin's refusal")
        assert "synchronized" not in plugin.log_text()
        assert "exceeds the limit" not in plugin.log_text()
        assert plugin.alive()
        assert "RESOURCE_EXHAUSTED" in line or "exceed" in line, line
        # left out: a new container is not pinned by it
        pod = cri.run_pod("after-failed-sync")
        cid = cri.create_container(pod.id, pod.config, "g", command=SHOW_CPUS, **GUARANTEED)
        cri.start_container(cid)
        assert cpus_of(cri.wait_for_output(cid, "Cpus_allowed_list")) == "0-1"


def test_large_create_container(plugin: PluginProcess, cri: CRIClient) -> None:
    """A CreateContainer of about 1.2 MB (800 env vars, 400 kB annotations, and what CRI
    adds) reaches the plugin in many frames and is pinned; the plugin stays connected."""
    envs = {f"VAR_{i:04d}": "x" * 1000 for i in range(800)}
    pod = cri.run_pod("large")
    cid = cri.create_container(
        pod.id, pod.config, "g", command=SHOW_CPUS, annotations=ANNOTATIONS, envs=envs, **GUARANTEED
    )
    cri.start_container(cid)
    assert cpus_of(cri.wait_for_output(cid, "Cpus_allowed_list")) == "1"
    r = cri.exec_sync(cid, ["sh", "-c", "echo $VAR_0799"])
    assert r.stdout.decode().strip() == "x" * 1000
    assert "pinner: large/g gets exclusive CPUs 1" in plugin.log_text()
    assert plugin.alive()
    assert "closing plugin" not in plugin.containerd_log_since_start()
