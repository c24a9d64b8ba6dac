"""NRI request latency in ``/metrics``: the histogram
``nri_resource_policy_nri_request_duration_seconds`` (an injected clock), the
real :class:`Session` timing what it serves over a socket pair (a bounded
label set whatever the runtime sends, failed requests counted too), and the
exposition of a real endpoint with the SST helper's ``peer_up`` gauge."""

from __future__ import annotations

from pathlib import Path

from nri_framework.contract import Peer
from nri_framework.instrumentation import Instrumentation, RequestLatency
from nri_framework.startup import PeerWatch
from nri_framework.stub import PluginStub, StubOptions
from nri_sst.retry import Backoff, Obstacle
from prometheus_client.parser import text_string_to_metric_families

from .test_instrumentation import get, make_host
from .test_stub import Trunk, create_request, synchronize, trunk  # noqa: F401 (a fixture)

NAME = RequestLatency.NAME


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def samples(latency: RequestLatency) -> dict[tuple[str, str, str], float]:
    """``(sample name, method, le)`` -> value of the rendered family."""
    return {
        (s.name, s.labels["method"], s.labels.get("le", "")): s.value
        for s in latency.family().samples
    }


def test_buckets_are_cumulative_with_sum_and_count() -> None:
    clock = FakeClock()
    latency = RequestLatency(clock, buckets=(0.001, 0.01))
    for seconds in (0.0005, 0.005, 0.005, 3.0):
        with latency.timing("CreateContainer"):
            clock.now += seconds
    got = samples(latency)
    assert got[(NAME + "_bucket", "CreateContainer", "0.001")] == 1
    assert got[(NAME + "_bucket", "CreateContainer", "0.01")] == 3
    assert got[(NAME + "_bucket", "CreateContainer", "+Inf")] == 4
    assert got[(NAME + "_count", "CreateContainer", "")] == 4
    assert abs(got[(NAME + "_sum", "CreateContainer", "")] - 3.0105) < 1e-9


def test_a_body_that_raises_is_still_timed() -> None:
    clock = FakeClock()
    latency = RequestLatency(clock)
    try:
        with latency.timing("Synchronize"):
            clock.now += 0.2
            raise ValueError("refused")
    except ValueError:
        pass
    assert samples(latency)[(NAME + "_count", "Synchronize", "")] == 1


async def test_the_session_times_what_it_serves_and_only_that(trunk: Trunk) -> None:  # noqa: F811
    latency = trunk.session.latency
    early = await trunk.call("CreateContainer", create_request("c0"))
    assert early.code != 0  # refused before Configure: still a request answered
    await synchronize(trunk)
    assert (await trunk.call("CreateContainer", create_request("c1"))).code == 0
    # a hostile runtime's made-up methods: answered UNIMPLEMENTED, no new label each
    for i in range(50):
        assert (await trunk.call(f"Bogus{i}")).code != 0
    assert sorted(latency.counts) == ["Configure", "CreateContainer", "Synchronize"]
    assert sum(latency.counts["CreateContainer"]) == 2


async def test_metrics_expose_the_latency_and_the_helpers_reachability(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    stub = PluginStub(host, StubOptions())
    stub.latency.observe("CreateContainer", 0.003)
    there: list[Obstacle | None] = [None]
    peer = Peer("SST helper", "ipc:///run/x.sock", lambda: there[0])
    watch = PeerWatch(peer, Backoff(0.1, 1.0))
    inst = Instrumentation(host, stub, "127.0.0.1:0", helper=watch)
    await inst.start()
    port = int(inst.listening()[0].rsplit(":", 1)[1])
    try:

        async def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
            status, _, body = await get(port, "/metrics")
            assert status == 200
            return {
                f.name: [(s.labels, s.value) for s in f.samples]
                for f in text_string_to_metric_families(body.decode())
            }

        fams = await scrape()
        hist = {s[0].get("le"): s[1] for s in fams[NAME]}
        assert hist["0.0025"] == 0 and hist["0.005"] == 1 and hist["+Inf"] == 1
        assert fams["nri_resource_policy_peer_up"] == [({"peer": "SST helper"}, 1.0)]
        watch.obstacle = Obstacle("ipc:///run/x.sock", "is missing", "")
        fams = await scrape()
        assert fams["nri_resource_policy_peer_up"] == [({"peer": "SST helper"}, 0.0)]
    finally:
        await inst.close()
