"""The chart's DaemonSet pod on the real runtime (issue #11, point 3).

The chart is rendered with the Helm library (allowPCT true and false); its
DaemonSet pod template is started through CRI by ``kubelet.py`` (a small
stand-in for the kubelet, which cannot run here) from the two images built by
``tests/images/builder.py``; its hostPath volumes land on test-owned directories:
the env's NRI socket directory for ``/var/run/nri``, a Xeon 6776P sysfs tree
(``nri_framework.simulate.sysfs``) where the chart mounts the host's ``/sys``,
a state dir, an empty ``/dev`` (no ``isst_interface``); ``kube-api-access``
carries a token and CA for the k8s tier's API server stack (behind
``daemonset_fixtures.ApiFront``), where the spec's BalloonsPolicy is applied as
the chart's ``config`` renders it.

Two things this machine cannot give, and what the tests do instead:

* **The sim backend**: there is no SST hardware here, so the chart is rendered
  with ``sstHelperBackend=sim`` (as an operator would on a node without SST):
  the helper runs ``--backend sim --sim-state /run/nri-sst/sim-state.json``, its
  state in the pod's ``sst-ipc`` emptyDir.
* **The 6776P's CPUs**: the plugin sees 256 CPUs in the fixture sysfs, the
  machine has a few. The spec's balloons lie on CPUs the kernel does not have
  (cpuset writes fail with ERANGE), so their containers are created (NRI's
  CreateContainer is where the plugin pins them, and containerd records the
  adjustment in the container's OCI spec, which must equal the balloon's set)
  but started only when their cpuset exists here; a started one prints
  ``Cpus_allowed_list`` and must equal its balloon's set. The chart's default
  configuration on a sysfs tree the size of this machine
  (``test_daemonset_default_chart_pins_started_containers``) starts one.
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

import pytest
import yaml
from containerd_env import ContainerdEnv
from cri_client import BUSYBOX_IMAGE, CRIClient, read_cri_log
from daemonset_fixtures import (
    EXAMPLES,
    build_images,
    find,
    free_port,
    image_refs,
    k8s_api,
    render_chart,
)
from kubelet import Kubelet, PodObject, RunningPod, ServiceAccount, Unsupported, probe_url

pytestmark = pytest.mark.e2e

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
        self.dev = root / "dev"
        self.dev.mkdir()
        self.state = root / "var-lib-nri-resource-policy"
        self.nri_dir = nri_dir
        self.paths = {
            "/sys": self.host / "sys",
            "/proc": self.host / "proc",
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


# --------------------------------------------------------------------------- translation


@pytest.mark.parametrize("allow_pct", [True, False], ids=["allowPCT", "noPCT"])
def test_daemonset_pod_translates_to_cri(allow_pct: bool, tmp_path: Path) -> None:
    """What the stand-in sends for the chart's pod: the rendered command, args, env and
    securityContext, the volumes on the test's directories (no runtime needed)."""
    ds = find(chart_docs(allow_pct, 18891), "DaemonSet")
    dirs = NodeDirs(tmp_path / "node", tmp_path / "nri")
    kl = kubelet_for(None, tmp_path / "kubelet", dirs, FAKE_SA, tmp_path / "logs")
    pod = PodObject.from_manifest(ds)
    sandbox = kl.sandbox_config(pod)
    vols = kl.volumes(pod)
    spec = pod.spec
    plugin = kl.container_config(pod, container(spec, PLUGIN), vols)
    helper = kl.container_config(pod, container(spec, HELPER), vols)

    assert sandbox.metadata.namespace == "kube-system"
    assert sandbox.linux.security_context.namespace_options.network == 2  # NODE: no CNI here
    assert sandbox.linux.security_context.privileged is allow_pct
    assert list(plugin.command) == ["nri-resource-policy"]
    assert list(plugin.args) == container(spec, PLUGIN)["args"]
    env = {kv.key: kv.value.decode() for kv in plugin.envs}
    assert env["NODE_NAME"] == NODE
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    psc = plugin.linux.security_context
    assert not psc.privileged and psc.readonly_rootfs and psc.no_new_privs
    assert list(psc.capabilities.drop_capabilities) == ["ALL"]
    assert psc.seccomp.profile_type == 0  # RuntimeDefault
    assert "/proc/kcore" in psc.masked_paths
    mounts = {m.container_path: (m.host_path, m.readonly) for m in plugin.mounts}
    assert mounts["/var/run/nri"] == (str(dirs.nri_dir), True)
    assert mounts["/host/sys"] == (str(dirs.host / "sys"), True)
    assert mounts["/var/lib/nri-resource-policy"] == (str(dirs.state), False)
    sa_dir = Path(mounts["/var/run/secrets/kubernetes.io/serviceaccount"][0])
    assert (sa_dir / "token").read_text() == "t0k3n"
    assert (sa_dir / "namespace").read_text() == "kube-system"
    assert oct((sa_dir / "ca.crt").stat().st_mode & 0o777) == "0o644"
    hmounts = {m.container_path: (m.host_path, m.readonly) for m in helper.mounts}
    assert hmounts["/run/nri-sst"][0] == mounts["/run/nri-sst"][0]  # one emptyDir, shared
    assert "/var/run/secrets/kubernetes.io/serviceaccount" not in hmounts
    hsc = helper.linux.security_context
    if allow_pct:
        assert hsc.privileged
        args = list(helper.args)
        assert args[args.index("--backend") :][:4] == ["--backend", "sim", "--sim-state", SIM_STATE]
        assert hmounts["/host/dev"] == (str(dirs.dev), False)
        assert hmounts["/host/sys"][1] is False
    else:
        assert not hsc.privileged and hsc.readonly_rootfs and hsc.no_new_privs
        assert list(hsc.capabilities.drop_capabilities) == ["ALL"]
        assert "/host/dev" not in hmounts and hmounts["/host/sys"][1] is True
        assert list(helper.args)[list(helper.args).index("--backend") + 1] == "none"


@pytest.mark.parametrize(
    "where,change",
    [
        ("pod", lambda s: s.update(hostPID=True)),
        ("container", lambda s: s["containers"][0].update(stdin=True)),
        ("securityContext", lambda s: s["containers"][0]["securityContext"].update(procMount="U")),
        ("volume", lambda s: s["volumes"].append({"name": "n", "nfs": {"server": "x"}})),
        ("hostPath", lambda s: s["volumes"][0]["hostPath"].update(path="/etc")),
        ("env", lambda s: s["containers"][0]["env"].append(
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})),
    ],
)  # fmt: skip
def test_daemonset_standin_refuses_unknown_fields(where: str, change: Any, tmp_path: Path) -> None:
    """A field the stand-in does not translate fails loudly, it is not ignored."""
    ds = find(chart_docs(True, 18891), "DaemonSet")
    change(ds["spec"]["template"]["spec"])
    dirs = NodeDirs(tmp_path / "node", tmp_path / "nri")
    kl = kubelet_for(None, tmp_path / "kubelet", dirs, FAKE_SA, tmp_path / "logs")
    pod = PodObject.from_manifest(ds)
    with pytest.raises(Unsupported):
        kl.sandbox_config(pod)
        vols = kl.volumes(pod)
        for c in pod.spec["containers"]:
            kl.container_config(pod, c, vols)


# --------------------------------------------------------------------------- the real pod


@pytest.fixture(scope="session")
def daemonset_images() -> dict[str, Path]:
    t0 = time.monotonic()
    try:
        out = build_images(say=lambda m: print(f"[images] {m}"))
    except (ImportError, AttributeError, OSError, RuntimeError) as exc:
        from _tier import unavailable

        unavailable("e2e", f"tests/images/builder.py cannot build the images: {exc}",
                    "NRI_E2E_REQUIRED")  # fmt: skip
    print(f"[daemonset] images ready in {time.monotonic() - t0:.1f}s: {out}")
    return out


@pytest.fixture
def imported(containerd_env: ContainerdEnv, daemonset_images: dict[str, Path]) -> None:
    for archive in daemonset_images.values():
        containerd_env.ctr("images", "import", str(archive))


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The API server stack with the spec's policy applied and the node created."""
    import subprocess

    from _tier import unavailable
    from apiserver_build import StackError
    from kubernetes import client

    t0 = time.monotonic()
    up = False
    try:
        with k8s_api(tmp_path_factory.mktemp("api-front")) as (st, front):
            up = True
            st.create_node(NODE, capacity={"cpu": "256", "memory": "1000Gi", "pods": "110"})
            policy = find(chart_docs(True, 1), "BalloonsPolicy")
            with st.api_client() as c:
                client.CustomObjectsApi(c).create_namespaced_custom_object(
                    "config.nri", "v1alpha1", "kube-system", "balloonspolicies", policy
                )
            print(f"[daemonset] API stack up in {time.monotonic() - t0:.1f}s")
            yield st, front
    except (StackError, OSError, subprocess.SubprocessError, ImportError) as exc:
        if up:
            raise
        unavailable("e2e", f"the k8s tier's API server stack cannot start: {exc}",
                    "NRI_E2E_REQUIRED")  # fmt: skip


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


def test_daemonset_pct_pod_pins_programs_resets_and_restarts(
    containerd_env: ContainerdEnv, cri: CRIClient, imported: None, api: Any, tmp_path: Path
) -> None:
    """allowPCT=true: the spec's steps 4-6 and 9.2 with the chart's pod on containerd."""
    t0 = time.monotonic()
    with node_with_plugin(True, containerd_env, cri, api, tmp_path) as (pod, kl, _dirs):
        _st, front = api
        assert front.requests > 0 and front.rejected == 0, "the plugin used the token"
        log = pod.logs()
        assert re.search(r"mode=managed", log), pod.diag()
        # the sidecar starts after the plugin container (as the kubelet starts them in
        # order): PCT may be degraded for a moment, until the helper's socket is there
        # and the background has set SST up
        state = wait(
            lambda: (
                (st := pod.state()["policy"])["pct_mode"] == "managed"
                and not st["pct_degraded"]
                and st
            ),
            "PCT managed, not degraded",
            30,
            pod.diag,
        )
        assert state["pct_mode"] == "managed", state
        pods = {}
        for name in ("pod-hp-1", "pod-hp-2", "pod-hp-3", "pod-hp-4", "pod-lp"):
            pods[name] = kl.run_pod(workload(name), start=False)
        t1 = time.monotonic()
        sets = check_pinning(cri, pod, pods)
        hp = set().union(*(sets[f"pod-hp-{i}"] for i in range(1, 5)))
        clos = helper_clos(sst_dir(kl, pod), hp | sets["pod-lp"])
        assert {clos[c] for c in hp} == {HP_CLOS}, clos
        assert {clos[c] for c in sets["pod-lp"]} == {LP_CLOS}, clos
        log = pod.logs()
        for line in (  # the spec's step 4 / 6.1 lines
            'pct: cpuClass "hp-pct" classified HP (managed: pctPriority=high, CLOS 0)',
            'pct: cpuClass "lp-pct" classified LP (managed: pctPriority=low, CLOS 3)',
            "pct: fallback CLOS for non-PCT CPUs set to 3 (LP)",
        ):
            assert line in log, pod.diag()
        # one AssociateCpus per CLOS per flush: pods decided while a flush is in flight
        # share the next one, so count CPUs, not lines
        assert hp <= associated_cpus(log, HP_CLOS), pod.diag()
        assert sets["pod-lp"] <= associated_cpus(log, LP_CLOS), pod.diag()
        before = {
            n: runtime_cpus(cri, next(iter(rp.containers.values()))) for n, rp in pods.items()
        }
        state_before = pod.state()["policy"]["containers"]

        # step 9.2: the pod stopped with the chart's grace period resets SST
        sim_state = sst_dir(kl, pod) / "sim-state.json"
        took = pod.stop()
        print(f"[daemonset] plugin pod stopped in {took:.1f}s (grace {30}s)")
        assert "Traceback" not in pod.logs() + pod.logs(HELPER), pod.diag()
        assert "stopping in managed mode; resetting SST" in pod.logs(HELPER), pod.diag()
        punits = json.loads(sim_state.read_text())["punits"]
        assert not any(p["cp_enable"] for p in punits.values()), punits
        assert not any(p["feature_state"] & 0b10 for p in punits.values()), punits

        # a restarted plugin pod moves no container
        pod.running = None
        pod.start()
        after = {n: runtime_cpus(cri, first(rp)) for n, rp in pods.items()}
        assert after == before
        state_after = pod.state()["policy"]["containers"]
        workloads = [first(rp) for rp in pods.values()]
        assert {c: state_after[c]["balloon"] for c in workloads} == {
            c: state_before[c]["balloon"] for c in workloads
        }
        assert "Traceback" not in pod.logs(), pod.diag()
        print(f"[daemonset] pct: pods {time.monotonic() - t1:.1f}s, "
              f"total {time.monotonic() - t0:.1f}s")  # fmt: skip


def test_daemonset_without_pct_pins_with_unprivileged_helper(
    containerd_env: ContainerdEnv, cri: CRIClient, imported: None, api: Any, tmp_path: Path
) -> None:
    """allowPCT=false: the helper unprivileged with --backend none, PCT degraded, the
    spec's pods still pinned to their balloons."""
    t0 = time.monotonic()
    with node_with_plugin(False, containerd_env, cri, api, tmp_path) as (pod, kl, _dirs):
        helper_cfg = pod.running.configs[HELPER]  # type: ignore[union-attr]
        assert not helper_cfg.linux.security_context.privileged
        pods = {n: kl.run_pod(workload(n), start=False) for n in ("pod-hp-1", "pod-lp")}
        check_pinning(cri, pod, pods)
        line = "pct: SST not supported on this host; ignoring PCT fields in cpuClasses"
        assert line in pod.logs(), pod.diag()
        print(f"[daemonset] no PCT: total {time.monotonic() - t0:.1f}s")


def test_daemonset_api_front_requires_the_token(api: Any) -> None:
    """The in-cluster endpoint of the pod answers 401 without the projected token and
    forwards with it (over TLS checked against the projected ca.crt)."""
    import ssl

    _st, front = api
    ctx = ssl.create_default_context(cadata=front.ca_crt.decode())
    url = f"https://127.0.0.1:{front.port}/apis/config.nri/v1alpha1/balloonspolicies"
    for token, want in ((None, 401), ("wrong", 401), (front.token, 200)):
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                code, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read()
        assert code == want, (token, code, body[:300])
    assert json.loads(body)["items"][0]["metadata"]["name"] == "default"


PROBE = (
    "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
    "echo NODE_NAME=$NODE_NAME KSH=$KUBERNETES_SERVICE_HOST; "
    "touch /rootfs-probe 2>/dev/null && echo rootfs=rw || echo rootfs=ro; "
    "cat /host/sys/devices/system/cpu/online; "
    "touch /host/sys/probe 2>/dev/null && echo sys=rw || echo sys=ro; "
    "ls /var/run/nri/ /run/nri-sst/ /var/run/secrets/kubernetes.io/serviceaccount/ 2>&1; "
    "echo probe-done; trap 'exit 0' TERM; while :; do sleep 1; done"
)


@pytest.mark.parametrize("allow_pct", [True, False], ids=["allowPCT", "noPCT"])
def test_daemonset_security_context_holds_in_the_runtime(
    allow_pct: bool, containerd_env: ContainerdEnv, cri: CRIClient, tmp_path: Path
) -> None:
    """The chart's pod with each container's image and command replaced by busybox
    printing what it got: the runtime applies the translated securityContext (no
    capabilities, no_new_privs, seccomp, read-only root for the plugin; a privileged
    helper only with allowPCT) and the mounts (6776P sysfs, NRI socket dir, token)."""
    ds = find(chart_docs(allow_pct, 18891), "DaemonSet")
    for c in ds["spec"]["template"]["spec"]["containers"]:
        c["image"], c["command"], c["args"] = BUSYBOX_IMAGE, ["sh", "-c", PROBE], []
    dirs = NodeDirs(tmp_path / "node", containerd_env.nri_socket.parent)
    work = short_dir(tmp_path)
    try:
        kl = kubelet_for(cri, work, dirs, FAKE_SA, containerd_env.pod_log_dir)
        running = kl.run_pod(PodObject.from_manifest(ds))
        out = {}
        for name, cid in running.containers.items():
            cri.wait_for_output(cid, "probe-done")
            out[name] = "\n".join(cri.container_output(cid))
        print(json.dumps(out, indent=1))
        plugin, helper = out[PLUGIN], out[HELPER]
        assert re.search(r"CapEff:\s+0+\n", plugin), plugin
        assert re.search(r"NoNewPrivs:\s+1", plugin) and re.search(r"Seccomp:\s+2", plugin)
        assert "rootfs=ro" in plugin and "sys=ro" in plugin
        assert f"NODE_NAME={NODE} KSH=127.0.0.1" in plugin
        assert "0-255" in plugin and "nri.sock" in plugin and "token" in plugin
        if allow_pct:
            assert not re.search(r"CapEff:\s+0+\n", helper) and "sys=rw" in helper, helper
        else:
            assert re.search(r"CapEff:\s+0+\n", helper) and "sys=ro" in helper, helper
            assert re.search(r"NoNewPrivs:\s+1", helper) and "rootfs=ro" in helper
        t0 = time.monotonic()
        kl.stop_pod(running)
        print(f"[daemonset] busybox pod stopped in {time.monotonic() - t0:.1f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_daemonset_default_chart_pins_started_containers(
    containerd_env: ContainerdEnv, cri: CRIClient, imported: None, api: Any, tmp_path: Path
) -> None:
    """``helm install`` with the chart's defaults (allowPCT=false, its default
    BalloonsPolicy) on a sysfs tree the size of this machine: a Guaranteed pod starts
    in a dedicated-cpus balloon and prints a ``Cpus_allowed_list`` equal to its CPUs."""
    st, _front = api
    cpus = machine_cpus()
    if cpus != set(range(len(cpus))) or len(cpus) < 2:
        pytest.skip(f"needs CPUs 0..N-1 (N >= 2) in this process's affinity, not {sorted(cpus)}")
    ns = "nri-default"  # the release namespace: the chart's BalloonsPolicy lives there
    port = free_port()
    # the release namespace joins kube-system in the reserved pool, so that the
    # plugin's own pod does not take this small node's only free CPU
    config = {
        "instrumentation": {"httpEndpoint": f"127.0.0.1:{port}"},
        "reservedPoolNamespaces": ["kube-system", ns],
    }
    docs = render_chart({"config": config}, ns)
    from kubernetes import client

    policy = ("config.nri", "v1alpha1", ns, "balloonspolicies")
    with st.api_client() as c:
        client.CustomObjectsApi(c).create_namespaced_custom_object(
            *policy, find(docs, "BalloonsPolicy")
        )
    try:
        with node_with_plugin(
            False, containerd_env, cri, api, tmp_path, docs=docs, topology=f"cpus:{len(cpus)}"
        ) as (pod, kl, _dirs):
            guaranteed = workload("pod-hp-1")  # asks for 2 CPUs: more than this node has
            one = {"cpu": "1", "memory": "128Mi"}
            guaranteed.annotations = {}  # the chart's balloon types match by QoS class
            # started here: without the spec's host /dev (the test's /dev dir is empty)
            guaranteed.spec = {k: v for k, v in guaranteed.spec.items() if k != "volumes"}
            for ctr in guaranteed.spec["containers"]:
                ctr["resources"] = {"requests": one, "limits": one}
                del ctr["volumeMounts"], ctr["securityContext"]
            # one pod: with CPU 0 reserved, this node has one CPU to give
            pods = {"guaranteed": kl.run_pod(guaranteed, start=False)}
            sets = check_pinning(cri, pod, pods)
            assert sets["guaranteed"] <= cpus and len(sets["guaranteed"]) == 1, sets
            print(f"[daemonset] default chart: {sets}")
            # a restarted plugin pod moves no container: the running one keeps its CPUs
            cid = first(pods["guaranteed"])
            bln = pod.state()["policy"]["containers"][cid]["balloon"]
            took = pod.stop()
            pod.running = None
            pod.start()
            state = pod.state()["policy"]
            assert state["containers"][cid]["balloon"] == bln, state
            cpus_now = {b["name"]: ids(b["cpus"]) for b in state["balloons"]}[bln]
            assert cpus_now == sets["guaranteed"] == ids(runtime_cpus(cri, cid)), state
            line = cri.exec_sync(cid, ["grep", "Cpus_allowed_list", "/proc/1/status"]).stdout
            assert ids(line.decode().split(":", 1)[1].strip()) == sets["guaranteed"], line
            print(f"[daemonset] plugin pod restarted (stop {took:.1f}s); {cid[:12]} kept {line!r}")
    finally:  # the module's API stack serves both runtimes
        with st.api_client() as c:
            client.CustomObjectsApi(c).delete_namespaced_custom_object(*policy, "default")
