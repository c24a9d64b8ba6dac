"""The long-lived heap leaves the garbage collector's walk (``settle_heap``).

A full collection walks every tracked object; after a Synchronize of 1000
containers that is a pause of milliseconds on the event loop inside whichever
request it lands in. The stub freezes what is alive once the Synchronize is
answered: checked on the real :class:`Session` over a socket pair (the
fixtures of ``test_stub``).
"""

from __future__ import annotations

import gc

from nri_framework.pb import nri_pb2 as pb

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
