"""The launch imports asyncio without TLS (``nri_framework.launch``): a plugin's
start loads no OpenSSL (~7 ms of every restart), and TLS still works after it
for what speaks TLS, the Kubernetes agent's client (urllib3, blocking, in its
own threads) talking to the API server.

Each check runs in a fresh interpreter (what is imported is the point). The
API server is a real HTTPS server on loopback with the certificate in
``tests/data/tls`` (self-signed for 127.0.0.1, valid until 2126, made for these
tests with ``openssl req -x509``; its key is no secret).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from nri_framework.simulate.sysfs import write_topology

TLS = Path(__file__).resolve().parents[2] / "data" / "tls"


#: a whole start of the launch: the policy host made on a real sysfs tree, the
#: stub's connect to a runtime socket that is not there (``--exit-on-disconnect``:
#: the run ends there, 1)
_RUN = """
import sys
from nri_framework.launch import main
rc = main(sys.argv[1:])
print("OUT", rc, "asyncio" in sys.modules, "ssl" in sys.modules, "_ssl" in sys.modules)
"""


def test_a_run_starts_without_loading_openssl(
    tmp_path: Path, python_lines: Callable[..., list[str]]
) -> None:
    host_root = write_topology(tmp_path / "host", "n4c16")
    argv = ["run", "--policy", "pinner", "--host-root", str(host_root), "--exit-on-disconnect"]
    argv += ["--state-dir", str(tmp_path / "state"), "--nri-socket", str(tmp_path / "nri.sock")]
    assert python_lines(_RUN, *argv) == ["1 True False False"]


_AGENT = """
import sys
from nri_framework import launch
launch.import_asyncio_without_tls()
import asyncio.base_events
print("OUT before", "_ssl" in sys.modules, asyncio.base_events.ssl)
import http.server, json, ssl, threading
cert, key, kubeconfig = sys.argv[1:4]

class Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"kind": "Node", "metadata": {"name": self.path.rsplit("/", 1)[-1]}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Api)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(cert, key)
server.socket = tls.wrap_socket(server.socket, server_side=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
with open(kubeconfig) as f:
    text = f.read().replace("PORT", str(server.server_address[1]))
with open(kubeconfig, "w") as f:
    f.write(text)
from nri_framework.agent.kube import KubeClient, PolicyResource, load_client_configuration
client = KubeClient(load_client_configuration(kubeconfig), PolicyResource.for_policy("balloons"))
print("OUT", client.get_node("node-1")["metadata"]["name"], "_ssl" in sys.modules)
client.close()
server.shutdown()
"""


def test_the_agents_client_speaks_tls_after_the_launch(
    tmp_path: Path, python_lines: Callable[..., list[str]]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "loopback",
                "cluster": {
                    "server": "https://127.0.0.1:PORT",
                    "certificate-authority": str(TLS / "loopback.crt"),
                },
            }
        ],
        "users": [{"name": "test", "user": {"token": "t0k3n"}}],
        "contexts": [{"name": "test", "context": {"cluster": "loopback", "user": "test"}}],
        "current-context": "test",
    }
    kubeconfig.write_text(json.dumps(config))
    cert, key = str(TLS / "loopback.crt"), str(TLS / "loopback.key")
    # asyncio without OpenSSL; then the client's TLS (verified against the CA) works
    assert python_lines(_AGENT, cert, key, str(kubeconfig)) == ["before False None", "node-1 True"]


def test_a_process_that_has_ssl_already_keeps_asyncios_tls(
    python_lines: Callable[..., list[str]],
) -> None:
    code = """
    import ssl, sys
    from nri_framework import launch
    launch.import_asyncio_without_tls()
    import asyncio.base_events
    print("OUT", asyncio.base_events.ssl is ssl, sys.modules["ssl"] is ssl)
    """
    assert python_lines(code) == ["True True"]


_MSGSPEC = """
import sys
from nri_framework import launch
blocked = "typing_extensions" not in sys.modules
import msgspec, msgspec._utils
from typing import Annotated, NotRequired, TypedDict
class Pin(msgspec.Struct, frozen=True):
    cpus: Annotated[str, msgspec.Meta(max_length=8)]
class Doc(TypedDict):
    pin: Pin
    note: NotRequired[str]
doc = msgspec.json.decode(b'{"pin": {"cpus": "0-3"}}', type=Doc)
try:
    msgspec.json.decode(b'{"pin": {"cpus": "0-3,5-9,11"}}', type=Doc)
except msgspec.ValidationError as exc:
    error = str(exc)
import typing_extensions
print("OUT", blocked, msgspec._utils._get_type_hints.__module__, doc["pin"].cpus, "note" in doc)
print("OUT", error)
print("OUT", typing_extensions.__name__)
"""


def test_msgspec_is_imported_without_typing_extensions_and_types_as_before(
    python_lines: Callable[..., list[str]],
) -> None:
    """The launch imports msgspec with typing's hints (~10 ms less of every
    start): annotations, metadata and NotRequired keys decode and validate as
    with typing_extensions, which loads as usual afterwards."""
    assert python_lines(_MSGSPEC) == [
        "True typing 0-3 False",
        "Expected `str` of length <= 8 - at `$.pin.cpus`",
        "typing_extensions",
    ]
