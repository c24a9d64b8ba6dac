"""The agent's loops on a recording stand-in of the API (ours, small: the k8s tier
runs them against a real API server): the configuration source's decisions and
status writes, NRT coalescing over its window (on an injected clock), conflicts
and back-off, extended resources from the Node watch and their retries."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from nri_framework.agent.config import ConfigSource
from nri_framework.agent.extres import ExtendedResources
from nri_framework.agent.kube import KubeError, PolicyResource
from nri_framework.agent.nrt import Clock, NrtPublisher
from nri_framework.zones import Zone, ZoneAttribute


async def io(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


class FakeApi:
    """Records requests; ``fail`` makes the next N calls of a method raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, int] = {}
        #: the HTTP status of the injected failures (default 500)
        self.status: dict[str, int] = {}
        self.in_flight = 0
        self.most_in_flight = 0
        self.nrt: dict[str, Any] | None = None
        self.node: dict[str, Any] = {"status": {"capacity": {"cpu": "8"}}}
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def _record(self, name: str, arg: Any) -> None:
        with self.lock:
            self.calls.append((name, arg))
            if self.fail.get(name):
                self.fail[name] -= 1
                raise KubeError(self.status.get(name, 500), f"{name} failed")

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def patch_policy_status(self, namespace: str, name: str, patch: Any) -> Any:
        self._record("status", (name, patch))
        return {}

    def get_nrt(self, name: str) -> Any:
        self.gate.wait(5)
        self._record("get_nrt", name)
        if self.nrt is None:
            raise KubeError(404, "not found")
        return self.nrt

    def create_nrt(self, body: Any) -> Any:
        self._record("create_nrt", body)
        self.nrt = dict(body, metadata=dict(body["metadata"], resourceVersion="1"))
        return self.nrt

    def replace_nrt(self, name: str, body: Any) -> Any:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.gate.wait(5)
            self._record("replace_nrt", body)
        finally:
            with self.lock:
                self.in_flight -= 1
        rv = int(body["metadata"].get("resourceVersion") or 0) + 1
        self.nrt = dict(body, metadata=dict(body["metadata"], resourceVersion=str(rv)))
        return self.nrt

    def get_node(self, name: str) -> Any:
        self._record("get_node", name)
        return self.node

    def patch_node_status(self, name: str, patch: Any, timeout: float = 5.0) -> Any:
        self.gate.wait(5)
        self._record("patch_node", patch)
        cap = self.node["status"]["capacity"]
        for k, v in patch["status"]["capacity"].items():
            if v is None:
                cap.pop(k, None)
            else:
                cap[k] = v
        return self.node


async def settle(predicate: Any, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


# --- configuration source -------------------------------------------------------------


def cr(name: str, generation: int = 1, uid: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "generation": generation},
        "spec": {"reservedResources": {"cpu": "1"}, "x": name},
    }


class Source:
    def __init__(self, reject: set[str] | None = None) -> None:
        self.api = FakeApi()
        self.applied: list[str] = []
        self.changes: list[Any] = []
        self.reject = reject or set()

        async def apply(text: str, source: str) -> str | None:
            self.applied.append(source)
            name = source.rsplit("/", 1)[1]
            return f"bad {name}" if name in self.reject else None

        self.source = ConfigSource(
            node="n1",
            namespace="ns",
            group_label="config.nri/group",
            resource=PolicyResource.for_policy("balloons"),
            client=self.api,  # type: ignore[arg-type]
            io=io,
            apply=apply,
            on_change=self.changes.append,
        )

    def statuses(self) -> list[tuple[str, Any]]:
        return [
            (name, patch["status"]["nodes"]["n1"] and patch["status"]["nodes"]["n1"]["status"])
            for kind, (name, patch) in self.api.calls
            if kind == "status"
        ]


async def test_accepted_does_not_wait_for_the_status_report() -> None:
    """A slow API server (the status PATCH hangs) does not hold back what waits
    for the first accepted configuration: the NRI registration."""
    s = Source()
    src = s.source
    release = threading.Event()
    patch = s.api.patch_policy_status

    def slow_patch(namespace: str, name: str, body: Any) -> Any:
        assert release.wait(30), "never released"
        return patch(namespace, name, body)

    s.api.patch_policy_status = slow_patch  # type: ignore[method-assign]
    src.on_policies("SYNC", [cr("default")])
    src.on_node("SYNC", [{"metadata": {"labels": {}}}])
    task = asyncio.ensure_future(src.reconcile())
    try:
        await asyncio.wait_for(src.accepted.wait(), 10)
        assert s.statuses() == []  # the report is still on its way
        assert s.changes == [{"reservedResources": {"cpu": "1"}, "x": "default"}]
    finally:
        release.set()
        await task
    assert s.statuses() == [("default", "Success")]


async def test_source_precedence_moves_the_status_entry() -> None:
    s = Source()
    src = s.source
    src.on_policies("SYNC", [cr("default"), cr("group.g")])
    src.on_node("SYNC", [{"metadata": {"labels": {}}}])
    await src.reconcile()
    assert s.applied == ["BalloonsPolicy ns/default"]
    assert s.statuses() == [("default", "Success")]
    assert src.accepted.is_set()
    assert s.changes == [{"reservedResources": {"cpu": "1"}, "x": "default"}]

    # our own status patch comes back as MODIFIED with the same generation: ignored
    src.on_policies("MODIFIED", cr("default"))
    await src.reconcile()
    assert len(s.applied) == 1

    src.on_node("MODIFIED", {"metadata": {"labels": {"config.nri/group": "g"}}})
    await src.reconcile()
    assert s.applied[-1] == "BalloonsPolicy ns/group.g"
    assert s.statuses()[1:] == [("default", None), ("group.g", "Success")]

    src.on_policies("ADDED", cr("node.n1"))
    await src.reconcile()
    assert s.statuses()[3:] == [("group.g", None), ("node.n1", "Success")]

    # deleted: nothing to remove from it, back to the group
    src.on_policies("DELETED", cr("node.n1"))
    await src.reconcile()
    assert s.statuses()[5:] == [("group.g", "Success")]

    # a new generation is delivered again, to the same object
    src.on_policies("MODIFIED", cr("group.g", 2))
    await src.reconcile()
    assert s.applied[-1] == "BalloonsPolicy ns/group.g"
    assert s.statuses()[6:] == [("group.g", "Success")]
    assert s.api.calls[-1][1][1]["status"]["nodes"]["n1"]["generation"] == 2

    # the group CR deleted: no effective configuration, no fall back to default
    src.on_policies("DELETED", cr("group.g"))
    await src.reconcile()
    assert s.changes[-1] is None
    assert len(s.applied) == 5

    await src.shutdown()  # nothing in force: nothing to remove
    assert len(s.statuses()) == 7


async def test_source_failure_is_reported_and_remembered() -> None:
    s = Source(reject={"default"})
    src = s.source
    src.on_node("SYNC", [])  # no Node object: no labels
    src.on_policies("SYNC", [cr("default")])
    await src.reconcile()
    assert not src.accepted.is_set()
    assert s.changes == [None]  # nothing in force
    (_, (name, patch)) = s.api.calls[-1]
    assert name == "default"
    assert patch["status"]["nodes"]["n1"]["status"] == "Failure"
    assert patch["status"]["nodes"]["n1"]["errors"] == "bad default"
    await src.reconcile()  # same uid and generation: not retried
    assert len(s.applied) == 1
    await src.shutdown()  # the entry goes on a clean stop, Failure or not
    assert s.statuses()[-1] == ("default", None)


async def test_source_recreated_object_is_delivered_again() -> None:
    s = Source()
    src = s.source
    src.on_node("SYNC", [])
    src.on_policies("SYNC", [cr("default")])
    await src.reconcile()
    src.on_policies("DELETED", cr("default"))
    src.on_policies("ADDED", cr("default", uid="other"))
    await src.reconcile()
    assert len(s.applied) == 2
    assert s.statuses() == [("default", "Success"), ("default", "Success")]


async def test_source_status_patch_retries() -> None:
    s = Source()
    s.api.fail["status"] = 1
    src = s.source
    src.on_node("SYNC", [])
    src.on_policies("SYNC", [cr("default")])
    await src.reconcile()
    assert s.api.names() == ["status", "status"]


# --- NRT ------------------------------------------------------------------------------


def zones(n: int) -> list[Zone]:
    return [
        Zone(
            name=f"b[{i}]", type="balloon", attributes=[ZoneAttribute(name="cpuset", value=str(i))]
        )
        for i in range(n)
    ]


class FakeClock(Clock):
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.t + seconds, fut)
        self.sleepers.append(entry)
        try:
            await fut
        finally:
            self.sleepers.remove(entry)

    async def advance(self, seconds: float, settle: float = 0.05) -> None:
        """Move on ``seconds``; wake who is due; let the loop run ``settle`` (real) s."""
        self.t += seconds
        for when, fut in list(self.sleepers):
            if when <= self.t and not fut.done():
                fut.set_result(None)
        await asyncio.sleep(settle)


class Publisher:
    """An NRT publisher on FakeApi and a FakeClock; ``state["n"]`` zones."""

    def __init__(self, window: float = 10.0) -> None:
        self.api = FakeApi()
        self.clock = FakeClock()
        self.state = {"n": 1}
        self.pub = NrtPublisher(
            node="n1",
            policy="balloons",
            client=self.api,  # type: ignore[arg-type]
            io=io,
            zones=lambda: zones(self.state["n"]),
            window=window,
            clock=self.clock,
        )

    def written_zones(self) -> int:
        return len(self.api.calls[-1][1]["zones"])


@pytest.fixture
async def publisher() -> Any:
    p = Publisher()
    task = asyncio.create_task(p.pub.run())
    yield p
    task.cancel()


async def test_nrt_first_write_at_once_then_one_per_window(publisher: Publisher) -> None:
    p, api = publisher, publisher.api
    p.pub.changed()  # disabled: nothing
    await asyncio.sleep(0.05)
    assert api.calls == []
    p.pub.set_enabled(True)  # the first publication: at once
    await settle(lambda: p.pub.writes == 1)
    assert api.names() == ["get_nrt", "create_nrt"]
    for i in range(2, 40):  # 38 changes within the window
        p.state["n"] = i
        p.pub.changed()
        await p.clock.advance(0.25)
    assert api.names() == ["get_nrt", "create_nrt"]  # 9.5 s: still waiting
    await p.clock.advance(0.5)
    await settle(lambda: p.pub.writes == 2)
    # one write of the state at that time; no GET before the PUT, which carries
    # the resourceVersion the create returned
    assert api.names() == ["get_nrt", "create_nrt", "replace_nrt"]
    assert p.written_zones() == 39
    assert api.calls[-1][1]["metadata"]["resourceVersion"] == "1"
    p.state["n"] = 3
    p.pub.changed()
    await p.clock.advance(9.9)
    assert p.pub.writes == 2
    await p.clock.advance(0.1)
    await settle(lambda: p.pub.writes == 3)
    assert api.calls[-1][1]["metadata"]["resourceVersion"] == "2"


async def test_nrt_configuration_change_writes_at_once(publisher: Publisher) -> None:
    p = publisher
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    p.state["n"] = 2
    p.pub.changed()
    await p.clock.advance(1)
    assert p.pub.writes == 1  # an ordinary change waits for the window
    p.pub.set_enabled(True)  # a configuration was accepted: no waiting
    await settle(lambda: p.pub.writes == 2)
    assert p.clock.now() == 1
    assert p.written_zones() == 2


async def test_nrt_no_write_when_unchanged(publisher: Publisher) -> None:
    p = publisher
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    for _ in range(3):
        p.pub.changed()
        await p.clock.advance(10)
    p.pub.set_enabled(True)
    await p.clock.advance(10)
    assert p.api.names() == ["get_nrt", "create_nrt"]


async def test_nrt_one_write_in_flight(publisher: Publisher) -> None:
    p, api = publisher, publisher.api
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    api.gate.clear()  # the next PUT blocks
    p.state["n"] = 2
    p.pub.changed()
    await p.clock.advance(10)
    await settle(lambda: api.in_flight == 1)
    for i in range(3, 30):  # changes and urgent ones while it hangs
        p.state["n"] = i
        p.pub.changed()
        p.pub.set_enabled(True)
        await p.clock.advance(10)
    api.gate.set()
    await settle(lambda: p.pub.writes == 3)
    await p.clock.advance(10)
    assert api.most_in_flight == 1
    assert api.names().count("replace_nrt") == 2  # the hung one, then one of the latest
    assert p.written_zones() == 29


async def test_nrt_conflict_is_answered_by_one_reread(publisher: Publisher) -> None:
    p, api = publisher, publisher.api
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    api.fail["replace_nrt"], api.status["replace_nrt"] = 1, 409
    p.state["n"] = 2
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 2)
    assert api.names()[2:] == ["replace_nrt", "get_nrt", "replace_nrt"]
    # conflicts every time: one re-read per try, then the back-off, not a loop
    api.fail["replace_nrt"] = 3
    p.state["n"] = 3
    p.pub.set_enabled(True)
    await settle(lambda: len(api.calls) == 8)
    await asyncio.sleep(0.05)
    assert len(api.calls) == 8
    assert api.names()[5:] == ["replace_nrt", "get_nrt", "replace_nrt"]
    await p.clock.advance(1)  # the retry waits 1 s, and the window since the last write
    assert len(api.calls) == 8
    await p.clock.advance(9)  # it reads first (what it knew was stale), once
    await settle(lambda: len(api.calls) == 10)
    await asyncio.sleep(0.05)
    assert api.names()[8:] == ["get_nrt", "replace_nrt"]
    assert p.pub.writes == 2
    await p.clock.advance(2)
    await settle(lambda: p.pub.writes == 3)
    assert api.names()[10:] == ["get_nrt", "replace_nrt"]


async def test_nrt_restart_on_an_unchanged_object_writes_nothing(publisher: Publisher) -> None:
    p, api = publisher, publisher.api
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    # a new process (nothing known) finds the object as it would write it
    again = Publisher()
    again.api.nrt = api.nrt
    task = asyncio.create_task(again.pub.run())
    try:
        again.pub.set_enabled(True)
        await settle(lambda: again.pub.writes == 1)
        assert again.api.names() == ["get_nrt"]
        again.state["n"] = 2  # a real change is written, on the version read
        again.pub.set_enabled(True)
        await settle(lambda: again.pub.writes == 2)
        assert again.api.names() == ["get_nrt", "replace_nrt"]
        assert again.api.calls[-1][1]["metadata"]["resourceVersion"] == "1"
    finally:
        task.cancel()


async def test_nrt_deleted_object_is_created_again(publisher: Publisher) -> None:
    p, api = publisher, publisher.api
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    api.fail["replace_nrt"], api.status["replace_nrt"] = 1, 404
    p.state["n"] = 2
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 2)
    assert api.names()[2:] == ["replace_nrt", "create_nrt"]


async def test_nrt_backs_off_and_merges_while_the_server_is_down(publisher: Publisher) -> None:
    p, api = publisher, publisher.api
    p.pub.set_enabled(True)
    await settle(lambda: p.pub.writes == 1)
    api.fail["replace_nrt"] = 10**6  # down
    for i in range(2, 2 + 600):  # ten minutes, a change every second
        p.state["n"] = i
        p.pub.changed()
        await p.clock.advance(1, settle=0.002)
    await asyncio.sleep(0.05)
    down = api.names().count("replace_nrt")
    # 1, 2, 4, 8, 16, then every 30 s: about 25 tries in 600 s, not 600
    assert 5 <= down <= 30, down
    api.fail["replace_nrt"] = 0  # back
    await p.clock.advance(30)
    await settle(lambda: p.pub.writes == 2)
    await p.clock.advance(30)
    assert api.names().count("replace_nrt") == down + 1  # one write on recovery
    assert p.written_zones() == 601  # of the latest state


# --- extended resources ----------------------------------------------------------------


async def test_extended_resources_loop() -> None:
    api = FakeApi()
    api.node["status"]["capacity"].update({"cpuclass.balloons.nri.io/x": "1", "example.com/y": "2"})
    api.fail["get_node"] = 1
    want: dict[str, int | None] = {
        "cpuclass.balloons.nri.io/*": None,
        "cpuclass.balloons.nri.io/hp": 4,
    }
    ext = ExtendedResources(
        node="n1",
        client=api,  # type: ignore[arg-type]
        io=io,
        desired=lambda: want,
        resync=30,
        retry=0.05,
    )
    task = asyncio.create_task(ext.run())
    try:
        ext.changed()  # not decided yet: nothing
        await asyncio.sleep(0.05)
        assert api.calls == []
        ext.set_in_force(True)  # fails once, retried 0.05 s later
        await settle(lambda: ext.rounds == 1)
        assert api.node["status"]["capacity"] == {
            "cpu": "8",
            "cpuclass.balloons.nri.io/hp": "4",
            "example.com/y": "2",
        }
        assert ext.published == {"cpuclass.balloons.nri.io/hp"}
        ext.set_in_force(False)
        await settle(lambda: ext.rounds == 2)
        assert api.node["status"]["capacity"] == {"cpu": "8", "example.com/y": "2"}
        assert ext.published == set()
    finally:
        task.cancel()


def node_obj(capacity: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "status": {"capacity": dict(capacity)}}


def watched(api: FakeApi, want: dict[str, int | None], **kw: Any) -> ExtendedResources:
    ext = ExtendedResources(
        node="n1",
        client=api,  # type: ignore[arg-type]
        io=io,
        desired=lambda: want,
        **{"resync": 30.0, "retry": 0.05, **kw},
    )
    ext.on_node("SYNC", [api.node])  # what the agent's Node watch delivers
    return ext


async def test_extended_resources_nothing_to_publish_sends_nothing() -> None:
    api = FakeApi()
    api.node["status"]["capacity"]["example.com/y"] = "2"
    want: dict[str, int | None] = {"cpuclass.balloons.nri.io/*": None}
    ext = watched(api, want)
    task = asyncio.create_task(ext.run())
    try:
        ext.set_in_force(True)
        for _ in range(20):  # container changes
            ext.changed()
            await asyncio.sleep(0.005)
        await settle(lambda: ext.rounds >= 1)
        await asyncio.sleep(0.05)
        assert api.calls == []  # no Node GET, no patch
        # someone else adds a key in our domain: the watch shows it, one patch removes it
        ext.on_node("MODIFIED", node_obj({"cpu": "8", "cpuclass.balloons.nri.io/z": "1"}))
        await settle(lambda: api.names() == ["patch_node"])
        assert api.calls[0][1] == {"status": {"capacity": {"cpuclass.balloons.nri.io/z": None}}}
    finally:
        task.cancel()


async def test_extended_resources_publish_from_the_watched_capacity() -> None:
    api = FakeApi()
    want: dict[str, int | None] = {"cpuclass.balloons.nri.io/hp": 4}
    ext = watched(api, want)
    task = asyncio.create_task(ext.run())
    try:
        ext.set_in_force(True)
        await settle(lambda: ext.rounds == 1)
        for _ in range(5):
            ext.changed()
            await asyncio.sleep(0.01)
        # our own patch comes back through the watch: no change, nothing more
        ext.on_node("MODIFIED", api.node)
        await asyncio.sleep(0.05)
        assert api.names() == ["patch_node"]
        want["cpuclass.balloons.nri.io/hp"] = 3
        ext.changed()
        await settle(lambda: api.names() == ["patch_node", "patch_node"])
        assert api.node["status"]["capacity"]["cpuclass.balloons.nri.io/hp"] == "3"
    finally:
        task.cancel()


async def test_extended_resources_watch_news_during_a_patch_are_kept() -> None:
    api = FakeApi()
    want: dict[str, int | None] = {
        "cpuclass.balloons.nri.io/*": None,
        "cpuclass.balloons.nri.io/hp": 4,
    }
    ext = watched(api, want)
    task = asyncio.create_task(ext.run())
    try:
        api.gate.clear()  # the patch hangs
        ext.set_in_force(True)
        await asyncio.sleep(0.05)
        # meanwhile someone adds an orphan: the watch shows it (the patch reply will not)
        orphan = node_obj({"cpu": "8", "cpuclass.balloons.nri.io/z": "1"})
        api.node["status"]["capacity"]["cpuclass.balloons.nri.io/z"] = "1"
        ext.on_node("MODIFIED", orphan)
        reply = {"status": {"capacity": {"cpu": "8", "cpuclass.balloons.nri.io/hp": "4"}}}
        api.node = reply  # what the hung patch will answer, older than the watch
        api.gate.set()
        await settle(lambda: api.names().count("patch_node") == 2)
        assert api.calls[-1][1]["status"]["capacity"]["cpuclass.balloons.nri.io/z"] is None
    finally:
        task.cancel()


async def test_extended_resources_resync_reads_only_when_publishing() -> None:
    api = FakeApi()
    want: dict[str, int | None] = {"cpuclass.balloons.nri.io/*": None}
    ext = watched(api, want, resync=0.02)
    task = asyncio.create_task(ext.run())
    try:
        ext.set_in_force(True)
        await settle(lambda: ext.rounds >= 5)
        assert api.calls == []  # nothing published: resyncs need no read
        want["cpuclass.balloons.nri.io/hp"] = 1
        await settle(lambda: api.names().count("get_node") >= 2)
        assert "patch_node" in api.names()
    finally:
        task.cancel()


def test_extended_resources_resync_is_jittered_per_node() -> None:
    def periods(node: str) -> list[float]:
        ext = ExtendedResources(node=node, client=None, io=None, desired=dict, resync=300)  # type: ignore[arg-type]
        return [ext.next_resync() for _ in range(20)]

    a, b = periods("node-a"), periods("node-b")
    assert a != b and len(set(a)) == 20
    assert all(225 <= x <= 375 for x in a + b)


async def test_extended_resources_retry_delay_grows() -> None:
    api = FakeApi()
    want: dict[str, int | None] = {"cpuclass.balloons.nri.io/hp": 4}
    api.fail["patch_node"] = 10**6
    ext = watched(api, want, retry=0.01)
    task = asyncio.create_task(ext.run())
    try:
        ext.set_in_force(True)
        await asyncio.sleep(0.6)
        # 0.01, 0.02, 0.04 ... 0.32: about 6 tries in 0.6 s, not 60
        assert 3 <= api.names().count("patch_node") <= 8, api.names()
        assert "get_node" not in api.names()  # the watched capacity still holds
    finally:
        task.cancel()


async def test_source_rejected_update_keeps_the_running_one_in_force() -> None:
    s = Source()
    src = s.source
    src.on_node("SYNC", [])
    src.on_policies("SYNC", [cr("default")])
    await src.reconcile()
    s.reject.add("default")
    src.on_policies("MODIFIED", cr("default", 2))
    await src.reconcile()
    assert s.statuses() == [("default", "Success"), ("default", "Failure")]
    assert len(s.changes) == 1 and s.changes[0] is not None
