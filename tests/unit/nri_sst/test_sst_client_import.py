"""The client imports pyzmq when the first client is built: a plugin started
without an SST helper (which imports this module through nri_balloons) never
loads it (~10 ms of its start)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_pyzmq_imported_by_the_first_client_not_by_the_plugin() -> None:
    code = textwrap.dedent(
        """
        import sys
        import nri_balloons.plugin
        import nri_sst.client as c
        print("zmq" in sys.modules)
        with c.SyncHelperClient("ipc:///nonexistent/helper.sock") as sync:
            print(type(sync.ctx).__module__, "zmq.asyncio" in sys.modules)
        aio = c.HelperClient("ipc:///nonexistent/helper.sock")
        print(type(aio.ctx).__module__)
        aio.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split("\n")[:3] == ["False", "zmq.sugar.context True", "zmq.asyncio"], (
        out.stdout + out.stderr
    )
