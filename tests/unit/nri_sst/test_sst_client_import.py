"""The blocking client (the plugin's reply path) speaks ZMTP itself: building
and using it never imports pyzmq; the asyncio client imports it when the
first one is built, and a plugin started without an SST helper (which
imports this module through nri_balloons) never loads it (~10 ms of its start)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_pyzmq_imported_by_the_first_asyncio_client_only() -> None:
    code = textwrap.dedent(
        """
        import sys
        import nri_balloons.plugin
        import nri_sst.client as c
        print("zmq" in sys.modules)
        with c.SyncHelperClient("ipc:///nonexistent/helper.sock") as sync:
            try:
                sync.request(c.m.Discover())
            except c.HelperUnavailable as exc:
                print(exc)
            print("zmq" in sys.modules)
        aio = c.HelperClient("ipc:///nonexistent/helper.sock")
        print(type(aio.ctx).__module__)
        aio.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split("\n")[:4] == [
        "False",
        "helper at ipc:///nonexistent/helper.sock not connected (Discover)",
        "False",
        "zmq.asyncio",
    ], out.stdout + out.stderr


def test_the_message_decoders_are_made_at_their_first_use() -> None:
    """A plugin started without a helper decodes no message: importing the
    policy builds neither decoder (each compiles every message's types); the
    first decode builds its decoder, once."""
    code = textwrap.dedent(
        """
        import nri_balloons.plugin
        from nri_sst import messages as m
        print(m._request_decoder.cache_info().currsize, m._reply_decoder.cache_info().currsize)
        m.decode_reply(m.encode(m.ErrorReply(code="malformed", message="x")))
        m.decode_reply(m.encode(m.ErrorReply(code="malformed", message="y")))
        print(m._request_decoder.cache_info().currsize, m._reply_decoder.cache_info().misses)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["0 0", "0 1"], out
