"""The fault suite's harness: kill points in the runtime simulator, the
create/remove churn, and what the suite measures after each restart.

Everything is real: the balloons plugin and the SST helper (sim backend) are
processes of their own, the runtime simulator speaks NRI to the plugin over
its unix socket, the checks read the plugin's ``/debug/state`` over HTTP and
the helper's CLOS associations over its ZeroMQ socket. The one thing of ours
added to the simulator is a kill point (:class:`KillPointRuntime`, on the
simulator's one request path).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from balloons_e2e import RuntimeLog, until
from google.protobuf.message import Message
from nri_framework import cpuset
from nri_framework.simulate.peer import PluginPeer
from nri_framework.simulate.runtime import NriError, SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, ScenarioError, wait_registered
from nri_framework.simulate.sysfs import online
from nri_sst import messages as m
from nri_sst.client import HelperClient, HelperUnavailable
from sst_node import Node

LISTENING = re.compile(r"instrumentation HTTP endpoint listening on [^\s:]+:(\d+) ")
ASSIGNING = "assigning container {} to balloon"
ASSIGNED = re.compile(r"assigning container default/([^/\s]+)/\S+ to balloon ([^{\s]+)\{")
HP_CLASS = "hp-pct"
"""The spec's HP cpuClass (examples/pct-managed/balloons-pct-managed.yaml) ..."""
HP_CLOS = 0
"""... and its CLOS (the policy logs ``classified HP (managed: pctPriority=high, CLOS 0)``)."""
CLOS_BOUNDS = {0: (2_300_000, 4_600_000), 3: (800_000, 2_300_000)}
"""kHz of the spec's CLOS 0 (base..turbo) and CLOS 3 (min..base) on the 6776P."""
SHAPES = (
    ("hp-bln", ("750m", "1", "2", "3")),
    ("lp-bln", ("1", "2", "3", "4")),
    ("default", ("250m", "750m", "1")),
)
"""Pods of the churn: a balloon type of the spec's policy and CPU requests
(odd ones split cores between balloons: CLOS is per core)."""
SST_RESET = "sst: PrepareManagedMode done (CPReset"
"""The helper's log line when it resets SST (every core to CLOS 0) to enter
managed mode; with ``keep_programmed`` on a programmed SST it logs another."""
START_TIMEOUT = 30.0
LAUNCH_ATTEMPTS = 3
RECOVERY_TIMEOUT = 30.0
"""Seconds a plugin has to report it recovered (registered, synchronized,
PCT not degraded): the liveness bound of every restart."""
NOTICE_TIMEOUT = 3.0
"""Seconds a plugin has to report a dead helper (``pct_degraded``) after a
decision that needed it."""
SETTLE = 0.5
"""Seconds the CLOS views of plugin and helper may take to agree once the
plugin reports it recovered (work it queued behind its last reply)."""


class KillPointRuntime(SimulatedRuntime):
    """The runtime simulator with a kill point: :meth:`arm` runs an action the
    moment the ``n``-th CreateContainer reply from now has arrived, before the
    runtime applies it (the plugin's decision has left, so it must already be
    persisted). Ours, for the fault suite only."""

    def __init__(self, socket_path: Any) -> None:
        super().__init__(socket_path)
        self._armed: tuple[int, Callable[[], None]] | None = None

    def arm(self, replies: int, action: Callable[[], None]) -> None:
        self._armed = (replies, action)

    def disarm(self) -> None:
        self._armed = None

    async def _request(
        self, peer: PluginPeer, method: str, req: Message, rtype: type[Message]
    ) -> Message | None:
        reply = await super()._request(peer, method, req, rtype)
        if method == "CreateContainer" and reply is not None and self._armed is not None:
            left, action = self._armed
            self._armed = (left - 1, action) if left > 1 else None
            if left <= 1:
                action()
        return reply


class RuntimeErrors(RuntimeLog):
    """The runtime simulator's error lines (why it closed a plugin), kept
    while in a ``with`` block."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)


@dataclass
class Figure:
    """One measured figure of the suite: every violation, in words."""

    name: str
    goal: str = "0"
    found: list[str] = field(default_factory=list)
    note: str = ""

    def add(self, text: str) -> None:
        self.found.append(text)

    @property
    def ok(self) -> bool:
        return not self.found


def table(figures: list[Figure]) -> str:
    rows = [("figure", "goal", "measured", "", "")] + [
        (f.name, f.goal, str(len(f.found)), "ok" if f.ok else "FAIL", f.note) for f in figures
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def ids(text: str) -> set[int]:
    return set(cpuset.ids(cpuset.parse(text))) if text else set()


def pretty(name: str) -> str:
    """namespace/pod/container of a churn pod (``sst_node.POD``: one container)."""
    return f"default/{name}/{name}c0"


# ------------------------------------------------------------------ reading state


async def debug_state(port: int) -> dict[str, Any]:
    """The plugin's ``/debug/state`` (a real HTTP client, in a thread)."""

    def get() -> dict[str, Any]:
        url = f"http://127.0.0.1:{port}/debug/state"
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
            return doc

    return await asyncio.to_thread(get)


#: Seconds the suite's own checks try to reach a helper that is up: a new client
#: fails fast once its connect grace (50 ms) is spent, which a loaded machine can
#: exceed; the plugin's own client is what the figures measure, not this one.
CHECK_CONNECT = 5.0


async def _ask_helper(endpoint: str, req: Any, reply_type: Any) -> Any:
    """One request of the suite's checks, a new client tried again while it is
    "not connected" (within :data:`CHECK_CONNECT`)."""
    deadline = time.monotonic() + CHECK_CONNECT
    while True:
        try:
            async with HelperClient(endpoint, timeout=2.0, client="fault-suite") as c:
                return await c.call(req, reply_type)
        except HelperUnavailable as exc:
            if "not connected" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def helper_clos(endpoint: str, cpus: list[int]) -> dict[int, int]:
    reply = await _ask_helper(endpoint, m.GetAssociation(cpus=cpus), m.GetAssociationReply)
    clos: dict[int, int] = reply.clos
    return clos


async def helper_punits(endpoint: str) -> list[m.PunitInfo]:
    reply = await _ask_helper(endpoint, m.Discover(), m.DiscoverReply)
    return [pu for pkg in reply.packages for pu in pkg.punits]


def clos_differences(state: dict[str, Any], helper: dict[int, int]) -> list[str]:
    """CPUs whose CLOS in the plugin's ``/debug/state`` is not the helper's."""
    out = []
    for row in state["policy"]["cpus"]:
        cpu = row["cpu"]
        mine, theirs = row.get("clos"), helper.get(cpu)
        if mine != theirs:
            out.append(
                f"cpu{cpu} ({row['balloon']}, class {row['class'] or '-'}): plugin reports "
                f"CLOS {mine}, helper has CLOS {theirs}"
            )
    return out


def hp_off_clos(state: dict[str, Any], helper: dict[int, int]) -> list[str]:
    """HP-class CPUs that the helper does not have on the HP CLOS."""
    return [
        f"cpu{row['cpu']} of {row['balloon']} (class {HP_CLASS}) is on CLOS "
        f"{helper.get(row['cpu'])} in the helper, not {HP_CLOS}"
        for row in state["policy"]["cpus"]
        if row["class"] == HP_CLASS and helper.get(row["cpu"]) != HP_CLOS
    ]


def shared_cpus(state: dict[str, Any], rt: SimulatedRuntime) -> list[str]:
    """CPUs in two balloons: the plugin's balloons and, for every container
    the plugin names a balloon of, the cpuset the runtime applied."""
    owners: dict[int, set[str]] = {}
    policy = state["policy"]
    for bln in policy["balloons"]:
        for cpu in ids(bln["cpus"]):
            owners.setdefault(cpu, set()).add(bln["name"])
    table_ = rt.containers
    for cid, info in policy["containers"].items():
        c = table_.get(cid)
        if c is not None:
            for cpu in ids(c.cpus):
                owners.setdefault(cpu, set()).add(info["balloon"])
    return [
        f"cpu{cpu} in {' and '.join(sorted(names))}"
        for cpu, names in sorted(owners.items())
        if len(names) > 1
    ]


def sst_not_programmed(punits: list[m.PunitInfo]) -> list[str]:
    """Punits whose SST-CP/TF state is not what the spec's policy programs."""
    out = []
    for pu in punits:
        where = f"pkg {pu.package} punit {pu.punit}"
        if not (pu.cp.enabled and pu.cp.priority == "ordered"):
            out.append(f"{where}: SST-CP enabled={pu.cp.enabled} priority={pu.cp.priority}")
        if not pu.tf.enabled:
            out.append(f"{where}: SST-TF not enabled")
        bounds = {c.clos: (c.min_khz, c.max_khz) for c in pu.clos}
        for clos, want in CLOS_BOUNDS.items():
            if bounds.get(clos) != want:
                out.append(f"{where}: CLOS {clos} bounds {bounds.get(clos)} kHz, want {want}")
    return out


# ------------------------------------------------------------------ the node


class FaultNode:
    """A :class:`sst_node.Node` whose plugin serves ``/debug/state`` on a free
    loopback port, with the restarts and checks of the fault suite."""

    def __init__(self, node: Node) -> None:
        self.n = node
        assert isinstance(node.rt, KillPointRuntime)
        self.rt: KillPointRuntime = node.rt
        self.port = 0
        self.unpinned = online(node.host_root)
        """the runtime's default cpuset: a container the plugin never placed"""
        self.closed_text = ""
        """the runtime's failure text when our plugin's connection ends"""

    @property
    def plugin(self) -> PluginProcess:
        return self.n.plugin

    async def started(self) -> None:
        """The plugin registered: learn its instrumentation port."""
        await self.plugin.wait_output("instrumentation HTTP endpoint listening on", START_TIMEOUT)
        port = next(mt for line in self.plugin.tail if (mt := LISTENING.search(line)))
        self.port = int(port.group(1))
        (info,) = self.rt.plugins
        self.closed_text = f"plugin {info.full_name} closed"

    async def kill_plugin(self) -> None:
        """SIGKILL (if not done yet) and wait until the runtime saw it go;
        the plugin's output is read to its end."""
        self.plugin.kill()
        await self.plugin.stop()
        await self.until(lambda: not self.rt.plugins, "the runtime to notice the dead plugin", 10)

    async def launch_plugin(self) -> list[str]:
        """Start the plugin (on the same state dir) until it registered, at
        most :data:`LAUNCH_ATTEMPTS` times; why the attempts before failed,
        where the runtime did not record it already."""
        why: list[str] = []
        for _ in range(LAUNCH_ATTEMPTS):
            mark = len(self.rt.failures)
            self.n.plugin = await PluginProcess.launch(self.n.cmd)
            try:
                await wait_registered(self.rt, self.plugin, START_TIMEOUT)
            except ScenarioError as exc:
                await self.kill_plugin()
                if len(self.rt.failures) == mark:
                    why.append(str(exc).splitlines()[0])
                continue
            await self.started()
            return why
        raise AssertionError(
            f"the plugin did not start in {LAUNCH_ATTEMPTS} attempts: {why}; runtime: "
            f"{self.rt.failures[-LAUNCH_ATTEMPTS:]}\n" + "\n".join(list(self.plugin.tail)[-40:])
        )

    @property
    def plugin_gone(self) -> bool:
        """The plugin exited or the runtime is not connected to it."""
        return self.plugin.proc.returncode is not None or not self.rt.plugins

    async def recovered(self) -> dict[str, Any]:
        """Wait (bounded) until the plugin reports it recovered: healthy
        (registered, synchronized) and PCT not degraded; its ``/debug/state``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECOVERY_TIMEOUT
        state: dict[str, Any] = {}
        error = ""
        while loop.time() < deadline:
            try:
                state = await debug_state(self.port)
            except OSError as exc:  # not listening (yet, or any more)
                error = f"; /debug/state: {exc}"
            else:
                policy = state.get("policy") or {}
                if state["health"]["ok"] and not policy.get("pct_degraded", True):
                    return state
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"the plugin did not recover in {RECOVERY_TIMEOUT}s: health {state.get('health')}, "
            f"pct_degraded {(state.get('policy') or {}).get('pct_degraded')}{error}"
        )

    async def until_degraded(self) -> None:
        """Wait (bounded) until the plugin reports PCT degraded (or is gone:
        the caller counts that as a drop)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NOTICE_TIMEOUT
        while True:
            try:
                if (await debug_state(self.port))["policy"].get("pct_degraded"):
                    return
            except OSError:
                if self.plugin_gone:
                    return
            if loop.time() > deadline:
                raise AssertionError(
                    f"the plugin did not report PCT degraded within {NOTICE_TIMEOUT}s"
                )
            await asyncio.sleep(0.05)

    async def programmed(self) -> list[str]:
        """What is not programmed on the helper's punits, once all is or
        :data:`SETTLE` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE
        while True:
            missing = sst_not_programmed(await helper_punits(self.n.helper.endpoint))
            if not missing or loop.time() > deadline:
                return missing
            await asyncio.sleep(0.05)

    async def clos_views(self) -> tuple[dict[str, Any], dict[int, int], list[str]]:
        """``/debug/state``, the helper's CLOS of every CPU, and where they differ,
        once they agree or :data:`SETTLE` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE
        cpus = self.all_cpus()
        while True:
            state = await debug_state(self.port)
            helper = await helper_clos(self.n.helper.endpoint, cpus)
            diff = clos_differences(state, helper)
            if not diff or loop.time() > deadline:
                return state, helper, diff
            await asyncio.sleep(0.05)

    def helper_log(self) -> int:
        """The helper's log so far (bytes): a mark for :meth:`sst_resets`."""
        return self.n.helper.log.stat().st_size if self.n.helper.log.exists() else 0

    def sst_resets(self, since: int) -> int:
        """How often the helper reset SST since the mark ``since``."""
        with self.n.helper.log.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace").count(SST_RESET)

    def all_cpus(self) -> list[int]:
        return sorted(ids(self.unpinned))

    def placed(self) -> dict[str, tuple[str, str]]:
        """Running containers the plugin placed: name -> (id, cpus)."""
        table_ = self.rt.containers
        out = {}
        for name, cid in self.n.containers.items():
            c = table_.get(cid)
            if c is not None and name in self.n.pods and c.cpus and c.cpus != self.unpinned:
                out[name] = (cid, c.cpus)
        return out

    def balloons(self, state: dict[str, Any], tail: list[str]) -> dict[str, str]:
        """Pod name -> balloon: from a ``/debug/state`` and the assignments
        logged after it (``tail``, the newest win)."""
        name_of = {cid: name for name, cid in self.n.containers.items()}
        out = {
            name_of[cid]: info["balloon"]
            for cid, info in state["policy"]["containers"].items()
            if cid in name_of
        }
        for line in tail:
            if mt := ASSIGNED.search(line):
                out[mt.group(1)] = mt.group(2)
        return out

    async def ensure_plugin(self) -> list[str]:
        """When the runtime lost our plugin (not by our kill): what happened,
        after launching it again; [] when it is still connected."""
        if not self.plugin_gone:
            return []
        code = self.plugin.proc.returncode
        why = f"plugin exited with code {code}" if code is not None else "plugin not connected"
        await self.kill_plugin()
        return [why, *await self.launch_plugin()]

    def assigned_again(self, names: list[str]) -> list[str]:
        """Of ``names``, the containers the running plugin placed anew."""
        tail = list(self.plugin.tail)
        return [x for x in names if any(ASSIGNING.format(pretty(x)) in line for line in tail)]

    until = staticmethod(until)


# ------------------------------------------------------------------ the churn


class Churn:
    """Creates and removes one-container pods of random shapes, keeping
    between ``low`` and ``high`` pods; how long the plugin took to answer
    each CreateContainer (the runtime's view) goes to ``answered[helper_down]``."""

    def __init__(self, node: Node, rng: random.Random, low: int = 4, high: int = 12) -> None:
        self.node = node
        self.rng = rng
        self.low = low
        self.high = high
        self.serial = 0
        self.refused: list[str] = []
        self.creates = 0
        self.removes = 0
        self.current: tuple[str, str] | None = None
        """the operation in flight: ("create" or "remove", pod name)"""
        self.helper_down = False
        self.answered: dict[bool, list[float]] = {False: [], True: []}

    async def step(self, creates: float = 0.55) -> tuple[str, float | None] | None:
        """A create (probability ``creates`` between ``low`` and ``high`` pods;
        its name and answer time) or a remove (None)."""
        n = len(self.node.pods)
        if n < self.low or (n < self.high and self.rng.random() < creates):
            return await self.create()
        await self.remove()
        return None

    async def create(self, balloon: str = "", cpu: str = "") -> tuple[str, float | None]:
        """One pod (of a random shape unless given); its name and the plugin's
        answer time (None: no answer)."""
        self.serial += 1
        name = f"f{self.serial}"
        shape = next((s for s in SHAPES if s[0] == balloon), None) or self.rng.choice(SHAPES)
        cpu = cpu or self.rng.choice(shape[1])
        before = len(self.node.rt.call_times("CreateContainer"))
        self.creates += 1
        self.current = ("create", name)
        try:
            await self.node.create(name, shape[0], cpu)
        except NriError as exc:
            self.refused.append(f"{pretty(name)} ({shape[0]}, {cpu} CPU): {exc}")
            if name in self.node.pods:
                await self.node.delete(name)
        finally:
            self.current = None
        times = self.node.rt.call_times("CreateContainer")
        if len(times) == before:
            return name, None
        self.answered[self.helper_down].append(times[-1])
        return name, times[-1]

    async def remove(self) -> None:
        self.removes += 1
        name = self.rng.choice(sorted(self.node.pods))
        self.current = ("remove", name)
        try:
            await self.node.delete(name)
        finally:
            self.current = None

    async def run(self, stop: asyncio.Event) -> None:
        """Churn until ``stop`` is set (the op in flight is finished)."""
        while not stop.is_set():
            await self.step()
            await asyncio.sleep(self.rng.uniform(0, 0.01))
