"""The SST model read and written directly, not through the helper process.

The model's state file is the simulated hardware: what the operator's
``intel-speed-select`` does before the plugin starts, and what the punits
hold after the helper exited, are read and written here through the
helper's own request handler over the sim backend.
"""

from __future__ import annotations

import json
from pathlib import Path

from nri_sst import PROTOCOL_VERSION
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend, SimConfig
from nri_sst.handler import RequestHandler


def model_handler(work: Path, host_root: Path, config: Path, client: bytes) -> RequestHandler:
    """A request handler on the model of ``work`` (``sst-sim.json``), greeted
    as ``client``."""
    model = SimConfig(**json.loads(config.read_text()))
    handler = RequestHandler(SimBackend(model, state_file=work / "sst-sim.json"), host_root)
    handler.dispatch(m.Hello(protocol=PROTOCOL_VERSION), client)
    return handler


def sst_summary(work: Path, host_root: Path, config: Path) -> tuple[list[str], list[str]]:
    """SST-CP and SST-TF states over every punit, read from the model's state
    file (the hardware) after the helper exited."""
    handler = model_handler(work, host_root, config, b"demo")
    reply = handler.dispatch(m.Discover(), b"demo")
    assert isinstance(reply, m.DiscoverReply)
    punits = [pu for pkg in reply.packages for pu in pkg.punits]
    cp = sorted({"enabled" if pu.cp.enabled else "disabled" for pu in punits})
    tf = sorted({"enabled" if pu.tf.enabled else "disabled" for pu in punits})
    for s in cp:
        print(f"  clos-enable-status:{s}")
        print(f"  enable-status:{s}")
    for s in tf:
        print(f"  speed-select-turbo-freq:{s}")
    return cp, tf
