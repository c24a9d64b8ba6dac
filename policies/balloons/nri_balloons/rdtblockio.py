"""RDT and block I/O classes of containers (``control.rdt``, ``control.blockio``).

As upstream's resource manager (``pkg/resmgr/cache``: ``setDefaultClasses``;
``pkg/resmgr/nri.go``: ``setDefaultClasses``): a container's class is the
effective annotation ``rdtclass.resource-policy.nri.io`` /
``blockioclass.resource-policy.nri.io`` (``<key>/container.<name>``, then
``<key>/pod``, then ``<key>``); without one, when ``usePodQoSAsDefaultClass``
is set and the runtime gave the container no class of its own, its pod's QoS
class (``Guaranteed``, ``Burstable``, ``BestEffort``). The class goes into the
CreateContainer adjustment (``LinuxResources.rdt_class`` / ``blockio_class``);
the runtime maps it to parameters from its own configuration (containerd's
``rdt_config_file`` / ``blockio_config_file``).

Differences from upstream: the classes are set at creation only (upstream
repeats the QoS default in later container updates); ``control.rdt.enable``
does not need resctrl here (upstream initializes goresctrl and rejects the
configuration without it), and ``partitions``/``options``/``force`` are not
programmed (see :mod:`nri_balloons.features`).

With a controller disabled an annotated class is omitted with upstream's
warning. Beyond upstream, an annotation value that cannot be a class name
(empty, longer than :data:`MAX_CLASS_NAME`, characters outside
:data:`CLASS_NAME`) is warned about and no class is set: the container is
created as if unannotated.
"""

from __future__ import annotations

import logging
import re

import msgspec
from nri_framework.model import Container, Pod, Resources

from nri_balloons import annotations as ann
from nri_balloons.config import Control
from nri_balloons.containers import pretty_name, qos_class

log = logging.getLogger("policy")

RDT_CLASS = "rdtclass.resource-policy.nri.io"
BLOCKIO_CLASS = "blockioclass.resource-policy.nri.io"

#: the longest class name taken from an annotation
MAX_CLASS_NAME = 128
#: what a class name is made of (goresctrl's RDT root class is ``system/default``)
CLASS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")
#: how much of a rejected annotation value a warning quotes
_QUOTED = 64


class _Controller(msgspec.Struct, frozen=True):
    what: str  # as upstream's warnings name it
    key: str


RDT = _Controller("RDT", RDT_CLASS)
BLOCKIO = _Controller("block I/O", BLOCKIO_CLASS)


def invalid_class_name(value: str) -> str | None:
    """Why ``value`` cannot be a class name, or ``None`` when it can."""
    if not value:
        return "empty"
    if len(value) > MAX_CLASS_NAME:
        return f"{len(value)} characters, at most {MAX_CLASS_NAME}"
    if CLASS_NAME.fullmatch(value) is None:
        return f"not a class name (letters, digits and {'_.:/-'!r}, a letter or digit first)"
    return None


def _quoted(value: str) -> str:
    if len(value) <= _QUOTED:
        return repr(value)
    return f"{value[:_QUOTED]!r}... ({len(value)} characters)"


def _effective(
    ctl: _Controller,
    enable: bool,
    use_qos: bool,
    own: str | None,
    pod: Pod,
    container: Container,
) -> str | None:
    value = ann.effective(ctl.key, pod, container)
    if value is not None:
        why = invalid_class_name(value)
        if why is not None:
            log.warning(
                "%s: invalid %s class annotation %s: %s (%s); no class set",
                pretty_name(pod, container),
                ctl.what,
                ctl.key,
                _quoted(value),
                why,
            )
            return None
        if not enable:
            log.warning(
                "%s: %s class control disabled, omitting class %s",
                pretty_name(pod, container),
                ctl.what,
                value,
            )
            return None
        return value
    if enable and use_qos and not own:
        return str(qos_class(pod, container))
    return None


def with_classes(
    resources: Resources, control: Control, pod: Pod, container: Container
) -> Resources:
    """``resources`` (of ``container``'s adjustment) with its RDT and block I/O classes."""
    own = container.resources  # the runtime's own classes (none without resources)
    rdt = _effective(
        RDT,
        control.rdt.enable,
        control.rdt.use_pod_qos_as_default_class,
        own.rdt_class if own is not None else None,
        pod,
        container,
    )
    blockio = _effective(
        BLOCKIO,
        control.blockio.enable,
        control.blockio.use_pod_qos_as_default_class,
        own.blockio_class if own is not None else None,
        pod,
        container,
    )
    if rdt is not None:
        resources = msgspec.structs.replace(resources, rdt_class=rdt)
    if blockio is not None:
        resources = msgspec.structs.replace(resources, blockio_class=blockio)
    return resources
