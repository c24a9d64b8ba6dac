"""``nri-resource-policy demo pct-managed|pct-assoc-only|balloons``: the
spec's walkthrough on a simulated dual-socket Xeon 6776P.

Everything runs as it would on a node, only the hardware and the runtime are
simulated: the sysfs tree of a 6776P is written to a temp dir; the SST helper
(``nri-sst-helper serve --backend sim``, the Xeon 6776P model of sst.md §5)
and the balloons plugin run as separate processes and talk over a real
ZeroMQ socket; the runtime simulator plays containerd 1.7 over a real NRI
unix socket; the pods are the spec's YAML (``demos/pct_managed``, the same
files as ``examples/pct-managed``).

``pct-managed`` prints, in the spec's order: the plugin's ``pct:`` lines
(step 4), the associations (6.1), the NRT balloon and container tables
(6.5), the CLOS of every pinned CPU (6.3), the punit of each HP balloon
(6.4), reporter lines (step 7) and the A/B of step 8, then the teardown (9.1,
9.2). Reporter figures are *simulated*: ``mhz_avg`` is Bzy MHz from the
helper's APERF/MPERF counters, which the model advances at each CPU's
effective frequency under load (sst.md §5.5.12-13); ``events_per_sec`` is
that frequency times :data:`EVENTS_PER_MHZ` per thread, sysbench's cpu test
scaling with the core clock, calibrated once on the spec's own hp-1 sample
(2077.58 events/s per thread at 4600 MHz). Every expectation the spec states
is checked; the exit status is non-zero when one fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from nri_framework import cpuset
from nri_framework.demo import Checks, finish, section
from nri_framework.inspect import render
from nri_framework.simulate.podspec import RuntimeDefaults, load_pod_file
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import (
    PluginProcess,
    ScenarioPaths,
    plugin_command,
    wait_registered,
)
from nri_framework.simulate.sysfs import online, write_topology
from nri_sst import PROTOCOL_VERSION
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend, SimConfig
from nri_sst.client import SyncHelperClient
from nri_sst.handler import RequestHandler, bzy_mhz

EVENTS_PER_MHZ = 2077.58 / 4600
"""sysbench cpu events/s per thread per MHz (see the module doc)."""
SAMPLE_SECONDS = 0.4
"""How long the reporter samples APERF/MPERF (simulated time runs in real time)."""
PCT_GREP = re.compile(r"pct(:| mock:)|associated cpus .* to CLOS")
SIM_LEVEL = 1
"""The SST-PP level the model boots with: the level Intel's PCT scripts query."""


def pods_dir() -> Path:
    return Path(str(resources.files("nri_balloons.demos") / "pct_managed"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def punit_of(cpu: int) -> tuple[int, int]:
    """sst.md §5.2: the 6776P's CPU -> (package, punit)."""
    return (cpu % 128) // 64, (cpu % 64) // 32


@dataclass
class Pod:
    name: str
    label: str
    threads: int
    container_id: str = ""
    pod_id: str = ""
    cpus: int = 0


@dataclass
class Node:
    """The simulated node: host root, helper, runtime, plugin."""

    work: Path
    host_root: Path
    helper_endpoint: str
    helper_state: Path
    helper_config: Path
    metrics: str
    rt: SimulatedRuntime
    plugin: PluginProcess
    helper: subprocess.Popen[bytes] | None
    pods: dict[str, Pod] = field(default_factory=dict)

    def client(self) -> SyncHelperClient:
        return SyncHelperClient(self.helper_endpoint, timeout=2.0, client="demo")

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.metrics}/debug/state", timeout=5) as r:
            return dict(json.load(r))

    def pct_lines(self, since: int = 0) -> list[str]:
        out = []
        for line in list(self.plugin.tail)[since:]:
            if PCT_GREP.search(line):
                out.append(line.split(" cpuclass: ", 1)[-1])
        return out

    async def create(self, path: Path) -> Pod:
        defaults = RuntimeDefaults(cpus=online(self.host_root), mems=online(self.host_root, "node"))
        (sim,) = load_pod_file(path, defaults)
        env = dict(e.split("=", 1) for e in sim.containers[0].env)
        doc = yaml.safe_load(path.read_text())
        pod = await self.rt.run_pod(sim.pod)
        created = await self.rt.create_container(pod.id, sim.containers[0])
        await self.rt.start_container(created.id)
        c = self.rt.container(created.id)
        cpus = cpuset.parse(c.resources.cpu.cpus) if c.resources and c.resources.cpu else 0
        p = Pod(
            name=doc["metadata"]["name"],
            label=env.get("LABEL", sim.pod.name),
            threads=int(env.get("THREADS", 0)) or cpus.bit_count(),
            container_id=created.id,
            pod_id=pod.id,
            cpus=cpus,
        )
        self.pods[p.name] = p
        return p

    async def delete(self, name: str) -> None:
        p = self.pods.pop(name)
        await self.rt.stop_pod(p.pod_id)
        await self.rt.remove_pod(p.pod_id)

    def clos(self, cpus: list[int]) -> dict[int, int]:
        with self.client() as c:
            return c.call(m.GetAssociation(cpus=cpus), m.GetAssociationReply).clos

    def discover(self) -> m.DiscoverReply:
        with self.client() as c:
            return c.call(m.Discover(), m.DiscoverReply)

    def report(self, p: Pod) -> tuple[float, float]:
        """The reporter of step 7 for ``p``: (events/s, Bzy MHz), simulated."""
        cpus = cpuset.ids(p.cpus)
        with self.client() as c:
            before = c.call(m.ReadFrequency(cpus=cpus), m.ReadFrequencyReply)
            time.sleep(SAMPLE_SECONDS)
            after = c.call(m.ReadFrequency(cpus=cpus), m.ReadFrequencyReply)
        mhz = [
            bzy_mhz(b, a, after.tsc_mhz) for b, a in zip(before.samples, after.samples, strict=True)
        ]
        avg = sum(mhz) / len(mhz)
        # one sysbench thread per pinned CPU unless THREADS says fewer: those
        # run on the fastest CPUs of the set (all equal here)
        events = p.threads * EVENTS_PER_MHZ * avg
        tag = f"[{p.label}]".ljust(10)
        print(
            f"  {tag} cpus={cpuset.format(p.cpus)} threads={p.threads} "
            f"events_per_sec={events:.2f} mhz_avg={avg:.0f}   (simulated)"
        )
        return events, avg


def sim_config(path: Path, **overrides: Any) -> Path:
    fields = {"current_level": SIM_LEVEL, **overrides}
    path.write_text(json.dumps(fields))
    return path


def start_helper(work: Path, host_root: Path, config: Path) -> tuple[str, subprocess.Popen[bytes]]:
    sock = work / "run" / "sst-helper.sock"
    sock.parent.mkdir(mode=0o700, exist_ok=True)
    endpoint = f"ipc://{sock}"
    cmd = [
        sys.executable, "-m", "nri_sst.cli", "serve",
        "--socket", endpoint,
        "--backend", "sim",
        "--host-root", str(host_root),
        "--sim-state", str(work / "sst-sim.json"),
        "--sim-config", str(config),
    ]  # fmt: skip
    log = (work / "sst-helper.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the SST helper did not start:\n{read_log(work)}")
        time.sleep(0.02)
    return endpoint, proc


def read_log(work: Path) -> str:
    path = work / "sst-helper.log"
    return path.read_text(errors="replace") if path.exists() else ""


def stop_helper(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class Demo:
    """One walkthrough: builds the node, runs ``body``, stops the plugin and
    the helper (SIGTERM), then ``after`` (teardown checks on the model)."""

    def __init__(self, name: str, config: str, *, helper: bool = True, keep: bool = False) -> None:
        self.name = name
        self.config = config
        self.use_helper = helper
        self.keep = keep
        self.checks = Checks()

    async def run(
        self,
        body: Callable[[Node, Checks], Any],
        prepare: Callable[[Path, Path, Path], None] | None = None,
        after: Callable[[Path, Path, Path, Checks], None] | None = None,
    ) -> Checks:
        work = Path(tempfile.mkdtemp(prefix=f"nri-demo-{self.name}-"))
        try:
            host_root = write_topology(work / "host", "xeon-6776p")
            cfg = work / "balloons.yaml"
            cfg.write_text(self.config)
            helper_cfg = sim_config(work / "sst-sim-config.json")
            if prepare is not None:
                prepare(work, host_root, helper_cfg)
            endpoint, helper = "", None
            if self.use_helper:
                endpoint, helper = start_helper(work, host_root, helper_cfg)
            try:
                await self._node(work, host_root, cfg, helper_cfg, endpoint, helper, body)
            finally:
                if helper is not None:
                    stop_helper(helper)
            if after is not None:
                after(work, host_root, helper_cfg, self.checks)
        finally:
            if self.keep:
                print(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
        return self.checks

    async def _node(
        self,
        work: Path,
        host_root: Path,
        cfg: Path,
        helper_cfg: Path,
        endpoint: str,
        helper: subprocess.Popen[bytes] | None,
        body: Callable[[Node, Checks], Any],
    ) -> None:
        metrics = f"127.0.0.1:{free_port()}"
        paths = ScenarioPaths(work, work / "nri" / "nri.sock", host_root, work / "state")
        extra = ["--config-file", str(cfg), "--metrics-address", metrics]
        if endpoint:
            extra += ["--sst-helper", endpoint]
        cmd = plugin_command("balloons", paths, extra)
        async with SimulatedRuntime(paths.socket) as rt:
            section(
                "node: dual-socket Xeon 6776P, 256 CPUs (simulated sysfs"
                + (" + SST model" if endpoint else "")
                + "), runtime simulator emulating containerd 1.7.24"
            )
            plugin = await PluginProcess.launch(cmd)
            try:
                info = await wait_registered(rt, plugin, 30)
                if endpoint:
                    print(f"  SST helper: {endpoint} (backend sim)")
                print(f"  plugin {info.full_name} registered; inspect: {metrics}")
                node = Node(
                    work, host_root, endpoint, work / "sst-sim.json", helper_cfg,
                    metrics, rt, plugin, helper,
                )  # fmt: skip
                await body(node, self.checks)
            finally:
                await plugin.stop()


# --------------------------------------------------------------------------- printing


def nrt_tables(state: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """The two jq tables of spec step 6.5 from the plugin's zones."""
    balloons: list[list[str]] = []
    containers: list[list[str]] = []
    node = "node-0"
    for z in state.get("zones", []):
        attrs = {a["name"]: a["value"] for a in z.get("attributes", [])}
        if z["type"] == "balloon":
            balloons.append([node, z["name"], attrs.get("cpuset", "")])
        elif z["type"] == "allocation for container":
            containers.append([node, z.get("parent", ""), z["name"], attrs.get("cpuset", "")])
    return balloons, containers


def print_tsv(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def get_assoc_lines(clos: dict[int, int]) -> Iterator[str]:
    """``intel-speed-select core-power get-assoc`` style."""
    for cpu in sorted(clos):
        yield f"  cpu-{cpu}  clos:{clos[cpu]}"


# --------------------------------------------------------------------------- pct-managed


async def pct_managed_body(n: Node, c: Checks) -> None:
    pods = pods_dir()
    section("4. the plugin applied the BalloonsPolicy: grep -E 'pct(:| mock:)'")
    lines = n.pct_lines()
    for line in lines:
        if "associated cpus" not in line:
            print("  " + line)
    expect = [
        "pct: mode=managed, 2 PCT cpuClass(es), 4 punit(s) across 2 package(s)",
        "pct: programmed CLOS 0 min=2300000 max=4600000 kHz",
        "pct: programmed CLOS 3 min=800000 max=2300000 kHz",
        'pct: cpuClass "hp-pct" classified HP (managed: pctPriority=high, CLOS 0)',
        'pct: cpuClass "lp-pct" classified LP (managed: pctPriority=low, CLOS 3)',
        "pct: fallback CLOS for non-PCT CPUs set to 3 (LP)",
    ]
    for e in expect:
        c.check(e in lines, e)
    c.check(
        any(
            x.startswith("pct: SST discovered: pkg=0 punit=0 level=1 cpus=0-31,128-159")
            for x in lines
        ),
        "pct: SST discovered: pkg=0 punit=0 level=1 cpus=0-31,128-159 ...",
    )
    c.check(any("PrepareManagedMode done" in x for x in lines), "PrepareManagedMode done")
    c.check(any("EnableCP done" in x for x in lines), "EnableCP done")

    section("5. the HP and LP pods")
    mark = len(n.plugin.tail)
    hp = [await n.create(pods / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    lp = await n.create(pods / "pod-lp.yaml")
    for p in [*hp, lp]:
        print(f"  pod/{p.name} created: cpus={cpuset.format(p.cpus)}")

    section("6.1 the plugin log: grep -E 'pct(:| mock:)|associated cpus .* to CLOS'")
    await n.plugin.wait_output(f"associated cpus {cpuset.format(lp.cpus)} to CLOS 3", 10)
    new = n.pct_lines(mark)
    for line in new:
        print("  " + line)
    for p in hp:
        c.check(
            f"pct: associated cpus {cpuset.format(p.cpus)} to CLOS 0" in new,
            f"{p.name}: associated cpus {cpuset.format(p.cpus)} to CLOS 0",
        )
    c.check(
        f"pct: associated cpus {cpuset.format(lp.cpus)} to CLOS 3" in new,
        f"pct-lp: associated cpus {cpuset.format(lp.cpus)} to CLOS 3",
    )

    section("6.5 NodeResourceTopology (the zones the agent publishes)")
    state = n.state()
    balloons, containers = nrt_tables(state)
    print_tsv(["NODE", "BALLOON", "CPUSET"], balloons)
    print()
    print_tsv(["NODE", "BALLOON", "CONTAINER", "CPUS"], containers)
    hp_zones = {r[1]: r[2] for r in balloons if r[1].startswith("hp-bln[")}
    c.check(
        sorted(hp_zones) == [f"hp-bln[{i}]" for i in range(4)]
        and all(cpuset.parse(v).bit_count() == 2 for v in hp_zones.values()),
        "four hp-bln[0..3] zones, each with a 2-CPU set",
    )
    lp_zone = next((r[2] for r in balloons if r[1] == "lp-bln[0]"), "")
    c.check(cpuset.parse(lp_zone).bit_count() == 8, "one lp-bln[0] zone with 8 CPUs")
    for p in [*hp, lp]:
        row = next((r for r in containers if r[2] == f"default/{p.name}/bench"), None)
        c.check(
            row is not None
            and row[3] == cpuset.format(p.cpus)
            and row[1] in hp_zones | {"lp-bln[0]": ""},
            f"{p.name}/bench pinned to its balloon's set {cpuset.format(p.cpus)}",
        )
    reserved = next((r[2] for r in balloons if r[1] == "reserved[0]"), None)
    c.check(
        reserved is not None and cpuset.parse(reserved) & ~cpuset.parse("0,1,128,129") == 0,
        f"reserved[0] within the reserved pool 0,1,128,129 ({reserved!r})",
    )

    section("6.2 SST state read back from the model (intel-speed-select ... info / get-config)")
    info = n.discover()
    for pu in (pu for pkg in info.packages for pu in pkg.punits):
        bounds = {cl.clos: cl for cl in pu.clos}
        print(
            f"  package-{pu.package} powerdomain-{pu.punit}: perf-profile current "
            f"level {pu.pp.current_level}; speed-select-turbo-freq:"
            f"{'enabled' if pu.tf.enabled else 'disabled'}; core-power enable-status:"
            f"{'enabled' if pu.cp.enabled else 'disabled'}, priority-type:"
            f"{1 if pu.cp.priority == 'ordered' else 0}; clos-0 min/max "
            f"{bounds[0].min_khz // 1000}/{bounds[0].max_khz // 1000} MHz, clos-3 min/max "
            f"{bounds[3].min_khz // 1000}/{bounds[3].max_khz // 1000} MHz"
        )
        c.check(
            (bounds[0].min_khz, bounds[0].max_khz) == (2_300_000, 4_600_000)
            and (bounds[3].min_khz, bounds[3].max_khz) == (800_000, 2_300_000),
            f"pkg {pu.package} punit {pu.punit}: CLOS bounds match the programmed CLOS lines",
        )

    section("6.3 per-CPU associations (core-power get-assoc)")
    all_hp = [cpu for p in hp for cpu in cpuset.ids(p.cpus)]
    lp_cpus = cpuset.ids(lp.cpus)
    print(f"  HP_CPUS={','.join(map(str, all_hp))}")
    print(f"  LP_CPUS={','.join(map(str, lp_cpus))}")
    clos = n.clos(sorted(all_hp + lp_cpus))
    for line in get_assoc_lines(clos):
        print(line)
    c.check(all(clos[cpu] == 0 for cpu in all_hp), "clos:0 for every CPU in HP_CPUS")
    c.check(all(clos[cpu] == 3 for cpu in lp_cpus), "clos:3 for every CPU in LP_CPUS")
    idle = n.clos(list(range(256)))
    c.check(
        all(k == 3 for cpu, k in idle.items() if cpu not in all_hp),
        "every other CPU (idle, reserved, LP) is on the LP CLOS 3",
    )

    section("6.4 punit spread (sst info)")
    rows: list[tuple[int, int, str]] = []
    info = n.discover()
    for pkg in info.packages:
        for pu in pkg.punits:
            rows.append((pu.package, pu.punit, cpuset.format(cpuset.from_ids(pu.cpus))))
    for pkg_id, pu_id, cpus in rows:
        print(f"    {pkg_id}    {pu_id}      {cpus}")
    for p in hp:
        keys = {punit_of(cpu) for cpu in cpuset.ids(p.cpus)}
        print(f"  {p.name}: cpus={cpuset.format(p.cpus)} -> (pkg, punit) {sorted(keys)}")
    spread = {punit_of(cpu) for p in hp for cpu in cpuset.ids(p.cpus)}
    c.check(len(spread) == 4, "the four HP balloons fall in four different (pkg, punit) rows")
    for pu in (pu for pkg in info.packages for pu in pkg.punits):
        c.check(
            pu.cp.enabled and pu.cp.priority == "ordered" and pu.tf.enabled,
            f"pkg {pu.package} punit {pu.punit}: SST-CP enabled, ordered; SST-TF enabled",
        )

    section(f"nri-resource-policy inspect --address {n.metrics}: balloons and punits")
    text = render(n.state())
    start = text.index("\nBALLOONS")
    end = text.index("\nCONTAINERS")
    print("\n".join("  " + x for x in text[start:end].strip("\n").splitlines()))
    pstart = text.find("\nPUNITS")
    if pstart >= 0:
        print("\n".join("  " + x for x in text[pstart:].strip("\n").splitlines()))
    by_name = {b["name"]: b for b in n.state()["policy"]["balloons"]}
    hp_punits = [tuple(by_name[f"hp-bln[{i}]"].get("punit", [])) for i in range(4)]
    c.check(
        all(len(p) == 1 for p in hp_punits) and len(set(hp_punits)) == 4,
        "inspect shows each HP balloon on its own punit",
    )

    section("7. observe performance (reporter lines; simulated)")
    hp_perf = [n.report(p) for p in hp]
    lp_perf = n.report(lp)
    c.check(
        all(round(mhz) == 4600 for _, mhz in hp_perf), "HP pods run at bucket-0 turbo, 4600 MHz"
    )
    c.check(lp_perf[1] <= 2300 + 1, "the LP pod is capped at base, 2300 MHz or less")

    section("8. A/B: the same 2-thread workload on the LP CLOS")
    await n.delete("pct-lp")
    ab = await n.create(pods / "pod-hp-on-lp.yaml")
    print(f"  pod/pct-hp-on-lp created: cpus={cpuset.format(ab.cpus)} (lp-bln, CLOS 3)")
    ab_events, ab_mhz = n.report(ab)
    hp_events, hp_mhz = hp_perf[0]
    per_hp, per_ab = hp_events / hp[0].threads, ab_events / ab.threads
    print(
        f"  per-thread events/s: hp {per_hp:.2f} -> hp-on-lp {per_ab:.2f} "
        f"(x{per_ab / per_hp:.3f}); mhz_avg ratio x{ab_mhz / hp_mhz:.3f}   (simulated)"
    )
    c.check(
        abs(per_ab / per_hp - ab_mhz / hp_mhz) < 0.01,
        "per-thread events/s drop by the frequency ratio (LP base / HP turbo)",
    )
    c.check(set(n.clos(cpuset.ids(ab.cpus)).values()) == {3}, "pct-hp-on-lp runs on CLOS 3")

    section("9.1 cleanup, Kubernetes side: every pod deleted")
    for name in list(n.pods):
        await n.delete(name)
    await n.plugin.wait_output(f"associated cpus {cpuset.format(hp[-1].cpus)} to CLOS 3", 10)
    state = n.state()
    ext = {
        k: v
        for k, v in (state.get("extended_resources") or {}).items()
        if v is not None and k.startswith("cpuclass.balloons.nri.io/")
    }
    print(f"  cpuclass.balloons.nri.io/* extended resources to publish: {json.dumps(ext)}")
    c.check(ext == {}, "no cpuclass.balloons.nri.io/* extended resource is published ({})")
    idle = n.clos(list(range(256)))
    c.check(set(idle.values()) == {3}, "freed HP CPUs went back to the LP CLOS 3")


def sst_summary(work: Path, host_root: Path, config: Path) -> tuple[list[str], list[str]]:
    """SST-CP and SST-TF states over every punit, read from the model's state
    file (the hardware) after the helper exited."""
    model = SimConfig(**json.loads(config.read_text()))
    handler = RequestHandler(SimBackend(model, state_file=work / "sst-sim.json"), host_root)
    handler.dispatch(m.Hello(protocol=PROTOCOL_VERSION), b"demo")
    reply = handler.dispatch(m.Discover(), b"demo")
    assert isinstance(reply, m.DiscoverReply)
    punits = [pu for pkg in reply.packages for pu in pkg.punits]
    cp = sorted({"enabled" if pu.cp.enabled else "disabled" for pu in punits})
    tf = sorted({"enabled" if pu.tf.enabled else "disabled" for pu in punits})
    for s in cp:
        print(f"  clos-enable-status:{s}")
        print(f"  enable-status:{s}")
    for s in tf:
        print(f"  speed-select-turbo-freq:{s}")
    return cp, tf


def managed_teardown(work: Path, host_root: Path, config: Path, c: Checks) -> None:
    """Step 9.2: the helper's SIGTERM in managed mode reset SST."""
    section("9.2 SST after the helper's SIGTERM (intel-speed-select ... info)")
    cp, tf = sst_summary(work, host_root, config)
    c.check(cp == ["disabled"], "SST-CP disabled on every punit")
    c.check(tf == ["disabled"], "SST-TF disabled on every punit")


def run_pct_managed(keep: bool = False) -> int:
    started = time.monotonic()
    config = (pods_dir() / "balloons-pct-managed.yaml").read_text()
    demo = Demo("pct-managed", config, keep=keep)
    return finish(asyncio.run(demo.run(pct_managed_body, after=managed_teardown)), started)


# --------------------------------------------------------------------------- pct-assoc-only

ASSOC_ONLY_CONFIG = """\
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata:
  name: default
  namespace: kube-system
spec:
  reservedResources:
    cpu: cpuset:0,1,128,129
  pinCPU: true
  showContainersInNrt: true
  balloonTypes:
  - name: reserved
  - name: hp-bln
    cpuClass: hp-clos0
    maxCPUs: 8
    preferNewBalloons: true
    preferSpreadingPods: false
  - name: lp-bln
    cpuClass: lp-clos3
    preferSpreadingPods: false
  cpuClasses:
  - name: default
    sstClosID: 3
  - name: hp-clos0
    sstClosID: 0
  - name: lp-clos3
    sstClosID: 3
  log:
    debug:
    - policy
    - cpu
"""
"""Reference §19's manual example: no minFreq/maxFreq, the operator owns SST."""

OPERATOR_CPUS = [0, 32, 64, 96]
"""``intel-speed-select -c 0,32,64,96 turbo-freq enable -a``: one CPU per punit."""


def operator_enables_turbo_freq(work: Path, host_root: Path, config: Path) -> None:
    """What the operator's ``intel-speed-select -c 0,32,64,96 turbo-freq enable
    -a`` does on the model before the plugin starts (reference §19): SST-TF on,
    SST-CP on with ordered priority, the listed cores (both threads) on CLOS 0,
    every other CPU on CLOS 3. Done on the model directly, not through the
    helper process: the operator's tool, not ours."""
    model = SimConfig(**json.loads(config.read_text()))
    handler = RequestHandler(SimBackend(model, state_file=work / "sst-sim.json"), host_root)
    handler.dispatch(m.Hello(protocol=PROTOCOL_VERSION), b"operator")
    handler.dispatch(m.PrepareManagedMode(), b"operator")  # CPReset + TFEnable + ordered
    handler.dispatch(m.EnableCP(), b"operator")
    hp = sorted({*OPERATOR_CPUS, *(c + 128 for c in OPERATOR_CPUS)})
    handler.dispatch(m.AssociateCpus(clos=0, cpus=hp), b"operator")
    rest = [c for c in range(256) if c not in hp]
    handler.dispatch(m.AssociateCpus(clos=3, cpus=rest), b"operator")
    handler.backend.idle()  # the model's state file is the hardware the helper starts on
    section("the operator: intel-speed-select -c 0,32,64,96 turbo-freq enable -a (on the model)")
    print("  SST-TF enabled, SST-CP enabled (ordered); cpus 0,32,64,96 (+ siblings) -> CLOS 0,")
    print("  every other CPU -> CLOS 3")


async def pct_assoc_only_body(n: Node, c: Checks) -> None:
    section("the plugin applied the BalloonsPolicy: grep -E 'pct(:| mock:)'")
    lines = n.pct_lines()
    for line in lines:
        if "associated cpus" not in line:
            print("  " + line)
    c.check(
        "pct: mode=assoc-only, 3 PCT cpuClass(es), 4 punit(s) across 2 package(s)" in lines,
        "pct: mode=assoc-only, 3 PCT cpuClass(es), 4 punit(s) across 2 package(s)",
    )
    c.check(
        any(
            x.startswith('pct: cpuClass "hp-clos0" classified HP (assoc-only: CLOS 0')
            for x in lines
        ),
        'cpuClass "hp-clos0" classified HP (assoc-only: CLOS 0 ...)',
    )
    c.check(
        not any("PrepareManagedMode done" in x or "EnableCP done" in x for x in lines),
        "the plugin did not program SST (no PrepareManagedMode / EnableCP)",
    )
    pods = pods_dir()
    mark = len(n.plugin.tail)
    hp = [await n.create(pods / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    lp = await n.create(pods / "pod-lp.yaml")
    await n.plugin.wait_output(f"associated cpus {cpuset.format(lp.cpus)} to CLOS 3", 10)
    section("the pods: grep 'associated cpus .* to CLOS'")
    for line in n.pct_lines(mark):
        if "associated cpus" in line:
            print("  " + line)
    for p in hp:
        c.check(set(n.clos(cpuset.ids(p.cpus)).values()) == {0}, f"{p.name} on CLOS 0")
    c.check(set(n.clos(cpuset.ids(lp.cpus)).values()) == {3}, "pct-lp on CLOS 3")
    spread = {punit_of(cpu) for p in hp for cpu in cpuset.ids(p.cpus)}
    c.check(len(spread) == 4, "the four HP balloons on four different punits")
    section("reporter lines (simulated)")
    perf = [n.report(p) for p in hp]
    lp_perf = n.report(lp)
    c.check(all(round(mhz) == 4600 for _, mhz in perf), "HP pods at bucket-0 turbo, 4600 MHz")
    c.check(lp_perf[1] <= 2300 + 1, "LP pod at the LP clip, 2300 MHz or less")
    for name in list(n.pods):
        await n.delete(name)


def assoc_only_after(work: Path, host_root: Path, config: Path, c: Checks) -> None:
    section("after the helper's SIGTERM: SST as the operator left it")
    cp, tf = sst_summary(work, host_root, config)
    c.check(cp == ["enabled"] and tf == ["enabled"], "assoc-only: the plugin never reset SST")


def run_pct_assoc_only(keep: bool = False) -> int:
    started = time.monotonic()
    demo = Demo("pct-assoc-only", ASSOC_ONLY_CONFIG, keep=keep)
    checks = asyncio.run(
        demo.run(pct_assoc_only_body, prepare=operator_enables_turbo_freq, after=assoc_only_after)
    )
    return finish(checks, started)


# --------------------------------------------------------------------------- balloons

BALLOONS_CONFIG = """\
apiVersion: config.nri/v1alpha1
kind: BalloonsPolicy
metadata:
  name: default
  namespace: kube-system
spec:
  reservedResources:
    cpu: cpuset:0,1,128,129
  pinCPU: true
  showContainersInNrt: true
  balloonTypes:
  - name: hp-bln
    maxCPUs: 8
    preferNewBalloons: true
    preferSpreadingPods: false
  - name: lp-bln
    preferSpreadingPods: false
"""
"""The spec's balloon types without cpuClasses: no SST helper at all."""


async def balloons_body(n: Node, c: Checks) -> None:
    pods = pods_dir()
    section("the pods")
    hp = [await n.create(pods / f"pod-hp-{i}.yaml") for i in range(1, 5)]
    lp = await n.create(pods / "pod-lp.yaml")
    for p in [*hp, lp]:
        print(f"  pod/{p.name}: cpus={cpuset.format(p.cpus)}")
    section("NodeResourceTopology (the zones the agent publishes)")
    balloons, containers = nrt_tables(n.state())
    print_tsv(["NODE", "BALLOON", "CPUSET"], balloons)
    print()
    print_tsv(["NODE", "BALLOON", "CONTAINER", "CPUS"], containers)
    sets = [p.cpus for p in [*hp, lp]]
    c.check(all(a & b == 0 for i, a in enumerate(sets) for b in sets[i + 1 :]), "no CPU shared")
    c.check([p.cpus.bit_count() for p in hp] == [2, 2, 2, 2], "each HP pod has 2 CPUs")
    c.check(lp.cpus.bit_count() == 8, "the LP pod has 8 CPUs")
    reserved = cpuset.parse("0,1,128,129")
    c.check(all(s & reserved == 0 for s in sets), "no pod on the reserved CPUs")
    c.check(
        sorted(r[1] for r in balloons if r[1].startswith("hp-bln"))
        == [f"hp-bln[{i}]" for i in range(4)],
        "one hp-bln balloon per HP pod (preferNewBalloons)",
    )
    section("pods deleted")
    for name in list(n.pods):
        await n.delete(name)
    balloons, _ = nrt_tables(n.state())
    left = sorted(r[1] for r in balloons)
    print(f"  balloons left: {', '.join(left)}")
    c.check(not any(x.startswith(("hp-bln", "lp-bln")) for x in left), "empty balloons deleted")


def run_balloons(keep: bool = False) -> int:
    started = time.monotonic()
    demo = Demo("balloons", BALLOONS_CONFIG, helper=False, keep=keep)
    return finish(asyncio.run(demo.run(balloons_body)), started)


SCENARIOS: dict[str, Callable[[bool], int]] = {
    "pct-managed": run_pct_managed,
    "pct-assoc-only": run_pct_assoc_only,
    "balloons": run_balloons,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nri-resource-policy demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", nargs="?", default="pct-managed", choices=list(SCENARIOS))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    return SCENARIOS[args.scenario](args.keep)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
