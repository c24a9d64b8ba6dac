"""Frequencies without privileged pods, end to end: the balloons plugin process
and the SST helper (`nri-sst-helper serve --backend sim`, the Xeon 6776P
model) as real processes over a real ZeroMQ socket, the spec's BalloonsPolicy
and pods through the runtime simulator, ``/metrics`` scraped over HTTP as
Prometheus would and ``nri-resource-policy inspect`` run as a command. The
figures are the model's (``source="sim"``). A stopped (SIGSTOP) or killed
(SIGKILL) helper: the scrape answers within a bound, without the frequency
families, and they come back with the helper."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from nri_framework.instrumentation import SCRAPE_WAIT
from nri_framework.simulate.scenario import PluginProcess, plugin_env
from prometheus_client.parser import text_string_to_metric_families
from sst_node import Node, node

EXAMPLES = Path(__file__).parents[3] / "examples" / "pct-managed"
SPEC = (EXAMPLES / "balloons-pct-managed.yaml").read_text()
LISTENING = re.compile(r"instrumentation HTTP endpoint listening on 127\.0\.0\.1:(\d+) ")
BUSY = "nri_policy_balloons_busy_mhz"
CLOS_MIN, CLOS_MAX = "nri_policy_balloons_clos_min_mhz", "nri_policy_balloons_clos_max_mhz"
FREQUENCY_FAMILIES = {BUSY, CLOS_MIN, CLOS_MAX, "nri_policy_balloons_busy_interval_seconds"}
SCRAPE_BOUND = SCRAPE_WAIT + 4.0
"""Seconds a scrape may take with the helper stopped (a liveness bound: the
reading's own timeout is 0.5 s; a loaded 2-core machine gets slack)."""


async def port_of(plugin: PluginProcess) -> int:
    await plugin.wait_output("instrumentation HTTP endpoint listening on", timeout=20)
    return next(int(mt.group(1)) for line in plugin.tail if (mt := LISTENING.search(line)))


async def scrape(port: int, path: str = "/metrics") -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
            assert resp.status == 200
            return str(resp.read().decode())

    return await asyncio.to_thread(get)


async def families(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = await scrape(port)
    return {
        f.name + ("_" + f.unit if f.unit and not f.name.endswith(f.unit) else ""): [
            (s.labels, s.value) for s in f.samples
        ]
        for f in text_string_to_metric_families(text)
    }


async def spec_node_pods(n: Node) -> None:
    for i in range(1, 5):
        await n.create_from(f"pct-hp-{i}", EXAMPLES / f"pod-hp-{i}.yaml")
    await n.create_from("pct-lp", EXAMPLES / "pod-lp.yaml")
    await n.plugin.wait_output("to CLOS 3", timeout=10)


def busy_by_balloon(fams: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, float]:
    return {labels["balloon"]: value for labels, value in fams.get(BUSY, [])}


@asynccontextmanager
async def spec_node() -> AsyncIterator[tuple[Node, int]]:
    """The spec's node with its pods, the plugin's metrics on a free port."""
    async with node(
        SPEC, topology="xeon-6776p", plugin_args=("--metrics-address", "127.0.0.1:0")
    ) as n:
        port = await port_of(n.plugin)
        await n.plugin.wait_output("balloons policy started", timeout=20)
        await spec_node_pods(n)
        yield n, port


async def test_two_scrapes_show_hp_balloons_faster_than_lp_simulated() -> None:
    async with spec_node() as (_n, port):
        first = await families(port)
        assert BUSY not in first and CLOS_MIN in first  # one reading: bounds, no interval yet
        await asyncio.sleep(0.3)
        second = await families(port)
        busy = busy_by_balloon(second)
        hp = {b: v for b, v in busy.items() if b.startswith("hp-bln[")}
        lp = {b: v for b, v in busy.items() if b.startswith("lp-bln[")}
        assert len(hp) == 4 and len(lp) == 1, busy
        assert min(hp.values()) > max(lp.values()), busy
        # what the model computes for the spec: bucket-0 turbo vs capped at base
        assert all(round(v) == 4600 for v in hp.values()) and max(lp.values()) <= 2300, busy
        assert {labels["source"] for labels, _ in second[BUSY]} == {"sim"}
        lows = {(lb["package"], lb["punit"], lb["clos"]): v for lb, v in second[CLOS_MIN]}
        highs = {(lb["package"], lb["punit"], lb["clos"]): v for lb, v in second[CLOS_MAX]}
        assert len(lows) == len(highs) == 4 * 4  # 4 punits x CLOS 0..3
        for pkg, pu in [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]:
            assert (lows[(pkg, pu, "0")], highs[(pkg, pu, "0")]) == (2300, 4600)
            assert (lows[(pkg, pu, "3")], highs[(pkg, pu, "3")]) == (800, 2300)

        out = await inspect_command(port)
        assert "frequency source: sim (simulated)" in out, out
        assert "BUSY-MHZ(SIM)" in out and "CLOS0-MHZ(SIM)" in out, out
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("hp-bln[")}
        assert len(rows) == 4 and all(" 4600 " in f" {r} " for r in rows.values()), out
        assert "2300-4600" in out and "800-2300" in out, out


async def inspect_command(port: int) -> str:
    """``nri-resource-policy inspect`` twice (its first reading is its baseline)."""
    out = ""
    for _ in range(2):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nri_framework", "inspect", "--address", f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=plugin_env(),
        )  # fmt: skip
        raw, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, raw.decode()
        out = raw.decode()
        await asyncio.sleep(0.2)
    return out


async def test_a_stopped_or_dead_helper_leaves_the_frequencies_absent_not_the_scrape_hung() -> None:
    async with spec_node() as (n, port):
        await families(port)
        await asyncio.sleep(0.2)
        assert busy_by_balloon(await families(port))  # the figures are there

        assert n.helper.proc is not None
        n.helper.proc.send_signal(signal.SIGSTOP)  # hung: the socket accepts, nobody answers
        try:
            fams = await asyncio.wait_for(families(port), SCRAPE_BOUND)  # a liveness bound
            assert "nri_policy_balloons_cores" in fams  # the rest of the scrape is there
            assert not FREQUENCY_FAMILIES & set(fams), sorted(fams)
        finally:
            n.helper.proc.send_signal(signal.SIGCONT)
        # back: figures again, over the interval since the last good reading
        await families(port)
        assert busy_by_balloon(await families(port))

        n.helper.kill()
        fams = await asyncio.wait_for(families(port), SCRAPE_BOUND)
        assert "nri_policy_balloons_cores" in fams
        assert not FREQUENCY_FAMILIES & set(fams), sorted(fams)
        state = await asyncio.wait_for(scrape(port, "/debug/state"), SCRAPE_BOUND)
        assert '"busy_mhz"' not in state
