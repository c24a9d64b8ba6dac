"""The node around the chart's DaemonSet pod in the e2e tier: the test-owned
directories its hostPath volumes land on (:class:`NodeDirs`), the kubelet stand-in
for it (:func:`kubelet_for`), the plugin pod's handle (:class:`PluginPod`), and the
checks of what it pinned and programmed (:func:`check_pinning`, :func:`helper_clos`).

The DaemonSet e2e modules: :mod:`test_daemonset_e2e` (the plugin pod on the real
runtime with the API server stack: pinning, PCT programming, restarts, the default
chart), :mod:`test_daemonset_pod_spec_e2e` (the pod spec as the runtime gets it:
the CRI translation, the stand-in's refusals, the security context);
:mod:`daemonset_node` (the node around the pod: its directories, the kubelet
stand-in, the plugin pod's handle, the pinning checks); :mod:`daemonset_fixtures`
(the chart render, the API front, the images).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from containerd_env import ContainerdEnv
from cri_client import BUSYBOX_IMAGE, CRIClient, read_cri_log
from daemonset_fixtures import EXAMPLES, find, free_port, image_refs, render_chart
from kubelet import Kubelet, PodObject, RunningPod, ServiceAccount, probe_url

NODE = "e2e-node-1"
PLUGIN = "nri-resource-policy-balloons"
HELPER = "sst-helper"
FULL_NAME = "90-resource-policy"  # --nri-plugin-index 90 (chart), default name
HP_CLOS, LP_CLOS = 0, 3
SIM_STATE = "/run/nri-sst/sim-state.json"
REPORTER = "grep Cpus_allowed_list /proc/self/status; trap 'exit 0' TERM; while :; do sleep 1; done"


def spec_policy() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "balloons-pct-managed.yaml").read_text())


def chart_docs(allow_pct: bool, port: int) -> list[dict[str, Any]]:
    """The chart as ``helm install --set allowPCT=.. --set sstHelperBackend=sim -f <the
    spec's policy as config>`` (no SST hardware here: the simulated 6776P)."""
    config = spec_policy()["spec"]
    config["instrumentation"] = {"httpEndpoint": f"127.0.0.1:{port}"}
    return render_chart({"allowPCT": allow_pct, "sstHelperBackend": "sim", "config": config})


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == name)


# --------------------------------------------------------------------------- node layout


class NodeDirs:
    """The test-owned directories the chart's hostPath volumes are mapped onto."""

    def __init__(self, root: Path, nri_dir: Path, topology: str = "xeon-6776p") -> None:
        from nri_framework.simulate.sysfs import prepare_host_root

        self.root = root
        self.host = prepare_host_root(topology, root)
        (self.host / "proc").mkdir(exist_ok=True)
        (self.host / "proc" / "meminfo").write_text("MemTotal:       1056964608 kB\n")
        # the helper's IRQ mounts (allowPCT): a /proc/interrupts-shaped file and an
        # empty /proc/irq; the sim backend models the IRQs themselves
        (self.host / "proc" / "interrupts").write_text(
            "           CPU0       CPU1\n"
            "   4:         10          0   IO-APIC    4-edge      ttyS0\n"
        )
        (self.host / "proc" / "irq").mkdir(exist_ok=True)
        self.dev = root / "dev"
        self.dev.mkdir()
        self.state = root / "var-lib-nri-resource-policy"
        self.nri_dir = nri_dir
        self.paths = {
            "/sys": self.host / "sys",
            "/proc": self.host / "proc",
            "/proc/interrupts": self.host / "proc" / "interrupts",
            "/proc/irq": self.host / "proc" / "irq",
            "/dev": self.dev,
            "/var/run/nri": nri_dir,
            "/var/lib/nri-resource-policy": self.state,
            "/var/lib/kubelet/pod-resources": root / "pod-resources",
        }


def kubelet_for(cri: Any, work: Path, dirs: NodeDirs, sa: ServiceAccount, logs: Path) -> Kubelet:
    return Kubelet(
        cri, node_name=NODE, work=work, host_paths=dirs.paths, service_account=sa, log_root=logs
    )


FAKE_SA = ServiceAccount(token="t0k3n", ca_crt=b"-----BEGIN CERTIFICATE-----\n", host="127.0.0.1",
                         port=6443)  # fmt: skip


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait(cond: Any, what: str, timeout: float, diag: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout}s\n{diag()}")
        time.sleep(0.2)


class PluginPod:
    """The chart's DaemonSet pod, started by the stand-in."""

    def __init__(self, kl: Kubelet, cri: CRIClient, env: ContainerdEnv, ds: dict[str, Any]):
        self.kl, self.cri, self.env, self.ds = kl, cri, env, ds
        self.running: RunningPod | None = None
        spec = ds["spec"]["template"]["spec"]
        self.url = probe_url(container(spec, PLUGIN))
        assert self.url is not None
        self.base = self.url.rsplit("/", 1)[0]

    def logs(self, name: str = PLUGIN) -> str:
        """The container's output (from its CRI log file: also once the pod is removed)."""
        assert self.running is not None
        rp = self.running
        path = Path(rp.sandbox_config.log_directory) / rp.configs[name].log_path
        return "\n".join(read_cri_log(path))

    def diag(self) -> str:
        return (
            f"--- plugin:\n{self.logs()[-3000:]}\n--- helper:\n{self.logs(HELPER)[-2000:]}\n"
            f"--- containerd:\n{self.env.log_text()[-2000:]}"
        )

    def start(self) -> PluginPod:
        offset = len(self.env.log_text())
        t0 = time.monotonic()
        self.running = self.kl.run_pod(PodObject.from_manifest(self.ds))
        connected = f'plugin \\"{FULL_NAME}\\" connected'
        wait(lambda: connected in self.env.log_text()[offset:], "registration", 60, self.diag)
        wait(lambda: f"registered as {FULL_NAME}" in self.logs(), "plugin's line", 10, self.diag)
        wait(lambda: http_get(self.url)[0] == 200, "/healthz 200", 60, self.diag)
        print(f"[daemonset] plugin pod registered and healthy in {time.monotonic() - t0:.1f}s")
        return self

    def state(self) -> dict[str, Any]:
        code, body = http_get(self.base + "/debug/state")
        assert code == 200, (code, body[:500])
        doc: dict[str, Any] = json.loads(body)
        return doc

    def stop(self) -> float:
        assert self.running is not None
        t0 = time.monotonic()
        self.kl.stop_pod(self.running)
        return time.monotonic() - t0


def workload(name: str) -> PodObject:
    """``examples/pct-managed/<name>.yaml`` with busybox printing its CPUs (the spec's
    pct-reporter image is not built here)."""
    doc = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    for c in doc["spec"]["containers"]:
        c["image"] = BUSYBOX_IMAGE
        c["command"] = ["sh", "-c", REPORTER]
    return PodObject.from_manifest(doc)


def associated_cpus(log: str, clos: int) -> set[int]:
    """Every CPU the plugin's log says it associated to ``clos``."""
    from nri_framework import cpuset

    out: set[int] = set()
    for found in re.finditer(rf"associated cpus (\S+) to CLOS {clos}\b", log):
        out |= set(cpuset.ids(cpuset.parse(found[1])))
    return out


def runtime_cpus(cri: CRIClient, cid: str) -> str:
    """The cpuset containerd put in the container's OCI spec (after NRI's adjustment)."""
    info = json.loads(cri.runtime.ContainerStatus(
        __import__("nri_framework.pb.cri_pb2", fromlist=["x"]).ContainerStatusRequest(
            container_id=cid, verbose=True), timeout=cri.timeout).info["info"])  # fmt: skip
    return str(info["runtimeSpec"]["linux"]["resources"]["cpu"].get("cpus", ""))


def first(rp: RunningPod) -> str:
    """The CRI id of the pod's (only) container."""
    return next(iter(rp.containers.values()))


def ids(text: str) -> set[int]:
    from nri_framework import cpuset

    return set(cpuset.ids(cpuset.parse(text))) if text else set()


def machine_cpus() -> set[int]:
    return os.sched_getaffinity(0)


def check_pinning(cri: CRIClient, pod: PluginPod, pods: dict[str, RunningPod]) -> dict[str, set]:
    """Per workload: the runtime's cpuset equals the balloon's; started where it exists."""
    state = pod.state()["policy"]
    balloons = {b["name"]: ids(b["cpus"]) for b in state["balloons"]}
    out = {}
    for name, rp in pods.items():
        cid = first(rp)
        bln = state["containers"][cid]["balloon"]
        want = balloons[bln]
        got = ids(runtime_cpus(cri, cid))
        assert got == want, f"{name}: runtime cpuset {got} != balloon {bln} {want}"
        if want <= machine_cpus():
            cri.start_container(cid)
            line = cri.wait_for_output(cid, "Cpus_allowed_list")
            assert ids(line.split(":", 1)[1].strip()) == want, (name, line)
        else:
            print(f"[daemonset] {name}: balloon {bln} cpus {sorted(want)[:4]}... are not "
                  f"on this machine ({sorted(machine_cpus())}): not started")  # fmt: skip
        out[name] = want
    return out


def helper_clos(sst_dir: Path, cpus: set[int]) -> dict[int, int]:
    from nri_sst import messages as m
    from nri_sst.client import SyncHelperClient

    with SyncHelperClient(f"ipc://{sst_dir}/helper.sock", timeout=5.0, client="e2e") as c:
        reply = c.call(m.GetAssociation(cpus=sorted(cpus)), m.GetAssociationReply)
    return dict(reply.clos)


@contextlib.contextmanager
def node_with_plugin(
    allow_pct: bool,
    containerd_env: ContainerdEnv,
    cri: CRIClient,
    api: Any,
    tmp_path: Path,
    *,
    docs: list[dict[str, Any]] | None = None,
    topology: str = "xeon-6776p",
) -> Iterator[tuple[PluginPod, Kubelet, NodeDirs]]:
    _st, front = api
    ds = find(docs or chart_docs(allow_pct, free_port()), "DaemonSet")
    plugin_ref, helper_ref = image_refs()
    spec = ds["spec"]["template"]["spec"]
    assert container(spec, PLUGIN)["image"] == plugin_ref
    assert container(spec, HELPER)["image"] == helper_ref
    dirs = NodeDirs(tmp_path / "node", containerd_env.nri_socket.parent, topology)
    sa = ServiceAccount(front.token, front.ca_crt, "127.0.0.1", front.port)
    kl = kubelet_for(cri, short_dir(tmp_path), dirs, sa, containerd_env.pod_log_dir)
    pod = PluginPod(kl, cri, containerd_env, ds)
    try:
        yield pod.start(), kl, dirs
    finally:
        if pod.running is not None:
            with contextlib.suppress(Exception):
                pod.stop()
        shutil.rmtree(kl.work, ignore_errors=True)


def short_dir(tmp_path: Path) -> Path:
    """A short directory for the pod volumes (the helper's socket lives in one: a unix
    socket path must stay under 108 bytes); ``node_with_plugin`` removes it."""
    return Path(tempfile.mkdtemp(prefix="ds-", dir=os.environ.get("TMPDIR") or None))


def sst_dir(kl: Kubelet, pod: PluginPod) -> Path:
    assert pod.running is not None
    return kl.volume_dir(pod.running.pod, "sst-ipc")
