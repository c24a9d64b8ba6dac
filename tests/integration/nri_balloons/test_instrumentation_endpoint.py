"""``instrumentation.httpEndpoint`` of the BalloonsPolicy moves the real
plugin process's instrumentation endpoint (runtime simulator, loopback HTTP):
it starts where the configuration names, a reload with another address
rebinds (the new one serves, the old one is closed), a reload with an invalid
or unbindable address leaves the old one serving, and ``--metrics-address``
overrides the configuration."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from balloons_e2e import http_get
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.simulate.scenario import PluginProcess, wait_registered
from nri_framework.simulate.sysfs import write_topology
from test_observe import balloon_samples

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- {name: work, namespaces: ["*"], minBalloons: 1, minCPUs: 1}
instrumentation:
  httpEndpoint: "%s"
"""


@contextmanager
def held() -> Iterator[int]:
    """A listening loopback socket (its port cannot be bound by another); its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def free_port() -> int:
    with held() as port:
        return port


async def serves(port: int) -> bool:
    try:
        status, body = await http_get(port, "/livez")
    except OSError:
        return False
    return (status, body) == (200, "ok\n")


async def until_serves(port: int, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await serves(port):
        assert loop.time() < deadline, f"nothing serves on 127.0.0.1:{port}"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def plugin(tmp_path: Path, endpoint: str, *extra: str) -> AsyncIterator[PluginProcess]:
    write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(CONFIG % endpoint)
    sock = tmp_path / "nri.sock"
    cmd = [sys.executable, "-m", "nri_framework", "run", "--policy", "balloons",
           "--nri-socket", str(sock), "--host-root", str(tmp_path / "host"),
           "--state-dir", str(tmp_path / "state"), "--config-file", str(cfg),
           "--exit-on-disconnect", *extra]  # fmt: skip
    async with SimulatedRuntime(sock) as rt:
        proc = await PluginProcess.launch(cmd)
        try:
            await wait_registered(rt, proc, 30)
            yield proc
        finally:
            await proc.stop()


async def reload(proc: PluginProcess, cfg: Path, endpoint: str, outcome: str) -> None:
    """Rewrite the config with ``endpoint``, SIGHUP; wait for ``outcome`` (``applied``
    or ``failed``) of that reload."""
    done = sum("config update from" in line for line in proc.tail)
    cfg.write_text(CONFIG % endpoint)
    proc.proc.send_signal(signal.SIGHUP)
    await proc.wait_output("config update from", timeout=10, count=done + 1)
    last = [x for x in proc.tail if "config update from" in x][-1]
    assert outcome in last, last


async def test_the_configured_endpoint_serves_and_moves_on_reload(tmp_path: Path) -> None:
    first = free_port()
    async with plugin(tmp_path, f"127.0.0.1:{first}") as proc:
        await until_serves(first)
        assert "work[0]" in await balloon_samples(first)  # /metrics of the policy
        cfg = tmp_path / "balloons.yaml"
        second = free_port()
        await reload(proc, cfg, f"127.0.0.1:{second}", "applied")
        await until_serves(second)
        assert not await serves(first)
        assert "work[0]" in await balloon_samples(second)
        # an address that is none: the reload is rejected, the endpoint stays
        await reload(proc, cfg, "127.0.0.1:http", "failed")
        await proc.wait_output("instrumentation.httpEndpoint: invalid address '127.0.0.1:http'")
        assert await serves(second)
        # an address taken by another process: the rest of the configuration
        # applies, the endpoint stays where it is (logged)
        with held() as taken:
            await reload(proc, cfg, f"127.0.0.1:{taken}", "applied")
            await proc.wait_output(f"cannot serve instrumentation on 127.0.0.1:{taken}")
            assert await serves(second)
        # no address: not served
        await reload(proc, cfg, "", "applied")
        await proc.wait_output("instrumentation HTTP endpoint closed")
        assert not await serves(second)


async def test_metrics_address_overrides_the_configuration(tmp_path: Path) -> None:
    fixed, asked = free_port(), free_port()
    address = f"127.0.0.1:{fixed}"
    async with plugin(tmp_path, f"127.0.0.1:{asked}", "--metrics-address", address) as proc:
        await until_serves(fixed)
        await proc.wait_output(
            f"the configuration's HTTP endpoint '127.0.0.1:{asked}' is ignored, "
            f"--metrics-address {address} is given"
        )
        assert not await serves(asked)
        await reload(proc, tmp_path / "balloons.yaml", f"127.0.0.1:{free_port()}", "applied")
        assert await serves(fixed) and not await serves(asked)


async def test_the_configured_endpoint_serves_before_the_runtime_is_there(tmp_path: Path) -> None:
    """The configuration from ``--config-file`` is the policy's at start: its
    endpoint answers (unhealthy, saying why) while no runtime is there yet."""
    write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    port = free_port()
    cfg.write_text(CONFIG % f"127.0.0.1:{port}")
    cmd = [sys.executable, "-m", "nri_framework", "run", "--policy", "balloons",
           "--nri-socket", str(tmp_path / "nri.sock"), "--host-root", str(tmp_path / "host"),
           "--state-dir", str(tmp_path / "state"), "--config-file", str(cfg)]  # fmt: skip
    proc = await PluginProcess.launch(cmd)
    try:
        await until_serves(port, 20)
        status, body = await http_get(port, "/healthz")
        assert status == 503 and "not registered with the NRI runtime" in body
    finally:
        await proc.stop()
