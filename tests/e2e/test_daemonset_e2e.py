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

Where the neighbouring test modules are: see :mod:`daemonset_node`.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from containerd_env import ContainerdEnv
from cri_client import CRIClient
from daemonset_fixtures import build_images, find, free_port, k8s_api, render_chart
from daemonset_node import (
    HELPER,
    HP_CLOS,
    LP_CLOS,
    NODE,
    associated_cpus,
    chart_docs,
    check_pinning,
    first,
    helper_clos,
    ids,
    machine_cpus,
    node_with_plugin,
    runtime_cpus,
    sst_dir,
    wait,
    workload,
)

pytestmark = pytest.mark.e2e


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
