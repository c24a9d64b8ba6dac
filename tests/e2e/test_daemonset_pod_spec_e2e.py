"""The chart's DaemonSet pod spec as the real runtime gets it (issue #11, point 3):
its translation to CRI by ``kubelet.py`` (allowPCT true and false), the stand-in's
refusal of fields it does not know, and the security context holding in the runtime.

Where the neighbouring test modules are: see :mod:`daemonset_node`.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from containerd_env import ContainerdEnv
from cri_client import BUSYBOX_IMAGE, CRIClient
from daemonset_fixtures import find
from daemonset_node import (
    FAKE_SA,
    HELPER,
    NODE,
    PLUGIN,
    SIM_STATE,
    NodeDirs,
    chart_docs,
    container,
    kubelet_for,
    short_dir,
)
from kubelet import PodObject, Unsupported

pytestmark = pytest.mark.e2e


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
