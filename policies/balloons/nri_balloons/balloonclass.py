"""The cpuClasses of balloons (reference §12.1, the balloons side): which class a
balloon's CPUs get, and the idle class on CPUs no balloon holds (upstream
``useCpuClass``, ``forgetCpuClass``, ``resetCpuClass``). The classes themselves
are :mod:`nri_balloons.cpuclass`'s."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from nri_framework import cpuset

from nri_balloons.balloon import Balloon
from nri_balloons.config import DEFAULT, BalloonsPolicySpec, BalloonType
from nri_balloons.cpuclass import CpuClassError, CpuClassHandler
from nri_balloons.errors import BalloonsError
from nri_balloons.gofmt import quote
from nri_balloons.sstlink import DEFAULT_WAIT, Wait

log = logging.getLogger("policy")

__all__ = ["class_of", "configure", "forget", "reset", "use"]


def configure(
    handler: CpuClassHandler,
    spec: BalloonsPolicySpec,
    allowed: int,
    strict: bool,
    wait: Wait = DEFAULT_WAIT,
) -> None:
    """The classes of ``spec`` on the ``allowed`` CPUs; ``idleCPUClass``, else
    ``default`` if defined, is the idle class. A failure raises
    :class:`BalloonsError` when ``strict``, else is logged. ``wait``: how the
    SST programming waits for the helper."""
    idle = spec.idle_cpu_class
    if not idle and any(cc.name == DEFAULT for cc in spec.cpu_classes):
        idle = DEFAULT
    try:
        handler.configure(spec.cpu_classes, spec.turbo_domain, allowed, idle, wait)
    except CpuClassError as exc:
        if strict:
            raise BalloonsError(f"failed to configure CPU class handler: {exc}") from None
        log.warning("failed to reconfigure CPU class handler: %s", exc)


def class_of(handler: CpuClassHandler, bdef: BalloonType) -> str:
    """The type's ``cpuClass``, else ``default`` if defined, else none."""
    if bdef.cpu_class:
        return bdef.cpu_class
    return DEFAULT if handler.known(DEFAULT) else ""


def use(handler: CpuClassHandler, bln: Balloon) -> None:
    """The class of each (component) balloon on its CPUs."""
    debug = log.isEnabledFor(logging.DEBUG)  # the CPU sets formatted for debug only
    for b in bln.walk():
        if b.components or not b.cpus:
            continue
        name = class_of(handler, b.bdef)
        if debug:
            log.debug(
                "apply CPU class %s on CPUs %s of %s",
                quote(name),
                quote(cpuset.format(b.cpus)),
                quote(b.name),
            )
        handler.use(b.cpus, name)


def forget(handler: CpuClassHandler, cpus: int) -> None:
    """``cpus`` back to the idle class."""
    if not cpus:
        return
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "forget class of cpus %s (idle class %s)",
            quote(cpuset.format(cpus)),
            quote(handler.idle_class),
        )
    handler.forget(cpus)


def reset(
    handler: CpuClassHandler, balloons: Iterable[Balloon], allowed: int, reserved: int
) -> None:
    """The idle class on every allowed CPU, then each balloon's class (upstream
    ``resetCpuClass`` + ``useCpuClass`` of every balloon)."""
    log.debug(
        "reset class of available cpus: %s to idle class %s (reserved: %s)",
        quote(cpuset.format(allowed)),
        quote(handler.idle_class),
        quote(cpuset.format(reserved)),
    )
    handler.reset()
    for bln in balloons:
        use(handler, bln)
