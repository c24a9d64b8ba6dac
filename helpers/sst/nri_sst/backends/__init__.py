"""SST backends: how the helper reaches the hardware.

* ``sim``  -- :class:`~nri_sst.backends.sim.SimBackend`, the Xeon 6776P model of
  sst.md §5 with its state in a JSON file.
* ``none`` -- :class:`~nri_sst.backends.none.NoneBackend`, "SST not supported".
* ``auto`` -- a real backend when ``<host-root>/dev/isst_interface`` exists,
  else ``none``.

TODO: the ``tpmi`` (Xeon 6, ioctls 5..17) and ``mbox`` (older Xeon) backends
over ``/dev/isst_interface`` are not written yet. They implement
:class:`~nri_sst.backends.base.Backend` with the struct layouts of sst.md
§1.3-§1.5 (checked by a test against the UAPI header compiled with gcc). Until
then ``auto`` falls back to ``none`` on real hardware and says so.
"""

from __future__ import annotations

from pathlib import Path

from nri_sst.backends.base import Backend
from nri_sst.backends.none import NoneBackend
from nri_sst.backends.sim import SimBackend, SimConfig

BACKENDS = ("auto", "sim", "none")

__all__ = ["BACKENDS", "Backend", "NoneBackend", "SimBackend", "SimConfig", "make_backend"]


def make_backend(
    name: str, host_root: Path, sim_state: Path | None = None, sim_config: SimConfig | None = None
) -> tuple[Backend, str]:
    """``(backend, note)``; ``note`` explains a fallback ("" when none)."""
    if name == "sim":
        return SimBackend(sim_config, state_file=sim_state), ""
    if name == "none":
        return NoneBackend(), ""
    if name == "auto":
        if (Path(host_root) / "dev" / "isst_interface").exists():
            return NoneBackend(), (
                "found dev/isst_interface but the tpmi/mbox backends are not implemented; "
                "using backend none"
            )
        return NoneBackend(), "no dev/isst_interface under the host root: SST not supported"
    raise ValueError(f"unknown backend {name!r} (expected one of {', '.join(BACKENDS)})")
