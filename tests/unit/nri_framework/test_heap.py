"""The long-lived heap leaves the garbage collector's walk (``settle_heap``), and
the collector is paused while it is made (``pause_heap``: the launch's imports,
a Synchronize).

A full collection walks every tracked object; after a Synchronize of 1000
containers that is a pause of milliseconds on the event loop inside whichever
request it lands in. The stub freezes what is alive once the Synchronize is
answered: checked on the real :class:`Session` over a socket pair (the
fixtures of ``test_stub``).
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path
from typing import Any

from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.sysfs import write_topology

from .test_stub import Trunk, trunk  # noqa: F401  (the fixture)


async def test_synchronize_freezes_what_it_leaves_alive(trunk: Trunk) -> None:  # noqa: F811
    configure = pb.ConfigureRequest(runtime_name="containerd", runtime_version="2.2.1")
    assert (await trunk.call("Configure", configure.SerializeToString())).code == 0
    req = pb.SynchronizeRequest()
    for i in range(3):
        c = req.containers.add()
        c.id, c.pod_sandbox_id, c.name = f"c{i}", "p", f"n{i}"
        c.annotations["k"] = "v"
    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        assert (await trunk.call("Synchronize", req.SerializeToString())).code == 0
        assert gc.get_freeze_count() > 0
        cached = trunk.session.host.cache.containers["c0"]
        assert gc.is_tracked(cached)
        assert not any(o is cached for o in gc.get_objects()), "still walked by collections"
    finally:
        gc.unfreeze()


async def test_synchronize_pauses_the_collector_while_it_decides(trunk: Trunk) -> None:  # noqa: F811
    configure = pb.ConfigureRequest(runtime_name="containerd", runtime_version="2.2.1")
    assert (await trunk.call("Configure", configure.SerializeToString())).code == 0
    host = trunk.session.host
    seen: list[bool] = []
    decide = host.synchronize

    def synchronize(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return decide(*args)

    host.synchronize = synchronize  # type: ignore[method-assign]
    req = pb.SynchronizeRequest()
    c = req.containers.add()
    c.id, c.pod_sandbox_id, c.name = "c0", "p", "n0"
    assert gc.isenabled()
    assert (await trunk.call("Synchronize", req.SerializeToString())).code == 0
    assert seen == [False], "the collector ran while the Synchronize was decided"
    assert gc.isenabled(), "the collector was not resumed after the Synchronize"


#: a fresh interpreter: the collector's state when ``nri_framework.cli`` is
#: imported by the launch, and after a command ran
_LAUNCH = """
import gc, sys
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in ("asyncio", "nri_framework.cli", "nri_framework.policies.pinner"):
            seen.append((name, gc.isenabled()))
        return None
sys.meta_path.insert(0, Watch())
from nri_framework.launch import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:  # --help
    rc = exc.code
print("LAUNCH", seen, gc.isenabled(), gc.get_freeze_count() > 0, rc)
"""


def _launch(*argv: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCH, *argv], capture_output=True, text=True, timeout=60
    )
    return next(line for line in out.stdout.splitlines() if line.startswith("LAUNCH "))[7:]


def test_the_launch_pauses_the_collector_for_the_imports_and_resumes_it() -> None:
    # a command that is not run: the collector is back before it runs
    # (asyncio is the start's first large import: the collector is paused before it)
    line = _launch("policies")
    assert line.startswith("[('asyncio', False), ('nri_framework.cli', False)")
    assert line.endswith("True True 0")
    # run: the policy's import too is made with the collector paused; a policy
    # that is not there still resumes it
    line = _launch("run", "--policy", "pinner", "--help")
    assert line == (
        "[('asyncio', False), ('nri_framework.cli', False),"
        " ('nri_framework.policies.pinner', False)] True True 0"
    )
    assert _launch("run", "--policy", "no-such-policy").endswith("True True 2")


#: a fresh interpreter: the collector's state while a run's policy host is made
#: (the topology, the configuration, the saved state: what lives as long as the
#: process), and after the run ended; the host's start is stopped right there
#: with a PolicyError (the run returns 1)
_RUN = """
import gc, sys
import nri_framework.host as host
from nri_framework.hookspecs import PolicyError
seen = []
class Host:
    def __init__(self, *args, **kwargs):
        seen.append(gc.isenabled())
        raise PolicyError("stopped by the test")
host.PolicyHost = Host
import nri_framework.cli as cli
cli.PolicyHost = Host
from nri_framework.launch import main
rc = main(sys.argv[1:])
print("RUN", seen, gc.isenabled(), gc.get_freeze_count() > 0, rc)
"""


def test_a_run_makes_its_host_with_the_collector_paused(tmp_path: Path) -> None:
    host_root = write_topology(tmp_path / "host", "n4c16")
    argv = ["run", "--policy", "pinner", "--host-root", str(host_root)]
    argv += ["--state-dir", str(tmp_path / "state"), "--nri-socket", str(tmp_path / "nri.sock")]
    out = subprocess.run(
        [sys.executable, "-c", _RUN, *argv], capture_output=True, text=True, timeout=60
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RUN ")), out.stderr)
    # paused while the host is made; resumed (and the heap frozen) when the run ended
    assert line == "RUN [False] True True 1"
