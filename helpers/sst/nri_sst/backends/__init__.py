"""SST backends: how the helper reaches the hardware.

* ``sim``  -- :class:`~nri_sst.backends.sim.SimBackend`, the Xeon 6776P model of
  sst.md §5 with its state in a JSON file.
* ``none`` -- :class:`~nri_sst.backends.none.NoneBackend`, "SST not supported".
* ``tpmi`` -- :class:`~nri_sst.backends.tpmi.TpmiBackend`, Xeon 6 through the
  TPMI ioctls 5..17 of ``<host-root>/dev/isst_interface``.
* ``mbox`` -- :class:`~nri_sst.backends.mbox.MboxBackend`, older Xeons through
  the legacy mailbox/MMIO ioctls.
* ``auto`` -- asks the device: ``tpmi`` when ``GET_PLATFORM_INFO`` answers with
  ``api_version >= 2``, ``mbox`` when it answers with version 1 and a mailbox
  or MMIO interface, else ``none`` with a note saying why.

The struct layouts of sst.md §1.3-§1.5 live in :mod:`nri_sst.backends.ioctl`
(checked by ``tests/unit/nri_sst/test_ioctl_uapi.py`` against the UAPI header
compiled with gcc).
"""

from __future__ import annotations

from pathlib import Path

from nri_sst.backends.base import Backend
from nri_sst.backends.ioctl import IoctlFn, IsstDevice
from nri_sst.backends.mbox import MboxBackend
from nri_sst.backends.none import NoneBackend
from nri_sst.backends.sim import SimBackend, SimConfig
from nri_sst.backends.tpmi import TpmiBackend

BACKENDS = ("auto", "sim", "none", "tpmi", "mbox")

__all__ = [
    "BACKENDS",
    "Backend",
    "MboxBackend",
    "NoneBackend",
    "SimBackend",
    "SimConfig",
    "TpmiBackend",
    "detect",
    "make_backend",
]


def detect(host_root: Path, ioctl_fn: IoctlFn | None = None) -> tuple[str, str]:
    """``(backend name, why)`` for ``auto``: ``tpmi``, ``mbox`` or ``none``."""
    device = IsstDevice(host_root, ioctl_fn)
    if ioctl_fn is None and not device.path.exists():
        return "none", f"no {device.path}: SST not supported (isst_if_common not loaded?)"
    try:
        info = TpmiBackend(host_root, ioctl_fn).platform_info()
    except OSError as exc:
        return "none", f"{device.path}: ISST_IF_GET_PLATFORM_INFO failed ({exc}); using none"
    api = info["api_version"]
    if api >= 2:
        return "tpmi", f"TPMI interface, api_version {api}"
    if api == 1 and (info["mbox_supported"] or info["mmio_supported"]):
        return "mbox", (
            f"legacy interface, mbox_supported={info['mbox_supported']} "
            f"mmio_supported={info['mmio_supported']}"
        )
    return "none", (
        f"{device.path}: api_version {api}, mbox_supported={info['mbox_supported']}, "
        f"mmio_supported={info['mmio_supported']}: no usable SST interface; using none"
    )


def make_backend(
    name: str,
    host_root: Path,
    sim_state: Path | None = None,
    sim_config: SimConfig | None = None,
    ioctl_fn: IoctlFn | None = None,
) -> tuple[Backend, str]:
    """``(backend, note)``; ``note`` explains a fallback ("" when none).

    ``ioctl_fn`` replaces the ioctl syscall of ``tpmi``/``mbox``/``auto`` (tests).
    """
    if name == "sim":
        return SimBackend(sim_config, state_file=sim_state), ""
    if name == "none":
        return NoneBackend(), ""
    if name == "tpmi":
        return TpmiBackend(host_root, ioctl_fn), ""
    if name == "mbox":
        return MboxBackend(host_root, ioctl_fn), ""
    if name == "auto":
        chosen, why = detect(Path(host_root), ioctl_fn)
        if chosen == "tpmi":
            return TpmiBackend(host_root, ioctl_fn), ""
        if chosen == "mbox":
            return MboxBackend(host_root, ioctl_fn), ""
        return NoneBackend(), why
    raise ValueError(f"unknown backend {name!r} (expected one of {', '.join(BACKENDS)})")
