"""resctrl: RDT cache and memory bandwidth allocation (``/sys/fs/resctrl``).

The helper's one way to resctrl, for :class:`~nri_sst.messages.ReadResctrl`
and :class:`~nri_sst.messages.SetResctrl`. The plugin computes every group's
schemata from ``control.rdt`` (as goresctrl's ``SetConfig`` does); the helper
checks the whole request against ``info`` (:func:`nri_sst.validate.resctrl`)
before it writes anything, then removes, creates and writes. Paths are built
from validated group names only (:data:`GROUP_NAME`), never a path of the
request.

Which groups the helper removes: goresctrl removes every control group it does
not configure (refusing a non-empty one unless ``force``). The runtime puts a
container in the group named exactly as its class (containerd's goresctrl, no
prefix), so a name prefix cannot mark the helper's groups: the helper records
the groups it created (:attr:`Resctrl.managed`; the sim saves it with its
state; the real backend keeps it in memory, or in ``managed_file`` when one
is given: the helper has no state directory yet, so a restarted helper
removes none of its old groups without ``force``) and removes, without
``force``, only those, and only when empty (else upstream's words:
``refusing to remove non-empty resctrl group``). With ``force`` every
unconfigured group goes, as upstream.

:class:`FsResctrl` is the kernel's, under the helper's host root; the sim
backend models the same (:class:`nri_sst.backends.sim.SimResctrl`), with the
kernel's refusals (``EINVAL`` for a bitmask the kernel does not take).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path

from nri_sst import messages as m

GROUP_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{m.MAX_RESCTRL_NAME - 1}}}\Z")
"""A control group's name (the runtime's class name); the root is ``""``."""
RESERVED_NAMES = frozenset({"info", "mon_groups", "mon_data", "tasks", "cpus", "schemata"})
MAX_INFO_FILE = 4096


class ResctrlError(Exception):
    """The kernel refused a resctrl operation (the message names the group)."""


def format_schemata(
    schemata: dict[str, dict[int, int]], resources: dict[str, m.ResctrlResource]
) -> str:
    """The ``schemata`` file's text: one line per resource, caches in hex."""
    lines = []
    for name in sorted(schemata):
        res = resources[name]
        vals = schemata[name]
        if res.cbm_mask:
            cells = ";".join(f"{i}={vals[i]:x}" for i in sorted(vals))
        else:
            cells = ";".join(f"{i}={vals[i]:d}" for i in sorted(vals))
        lines.append(f"{name}:{cells}\n")
    return "".join(lines)


def parse_schemata(text: str, resources: dict[str, m.ResctrlResource]) -> dict[str, dict[int, int]]:
    """A ``schemata`` file's lines of known resources (others left out)."""
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        name, _, cells = line.strip().partition(":")
        res = resources.get(name)
        if res is None:
            continue
        vals: dict[int, int] = {}
        for cell in cells.split(";"):
            key, _, value = cell.partition("=")
            try:
                vals[int(key)] = int(value, 16 if res.cbm_mask else 10)
            except ValueError:
                continue
        out[name] = vals
    return out


class Resctrl(ABC):
    """resctrl as the helper sees it; subclasses give the primitives."""

    def __init__(self) -> None:
        self.managed: set[str] = set()

    @abstractmethod
    def mounted(self) -> bool: ...

    @abstractmethod
    def resources(self) -> dict[str, m.ResctrlResource]: ...

    @abstractmethod
    def group_names(self) -> list[str]:
        """Every control group (the root left out)."""

    @abstractmethod
    def schemata(self, group: str) -> dict[str, dict[int, int]]: ...

    @abstractmethod
    def has_tasks(self, group: str) -> bool: ...

    @abstractmethod
    def create(self, group: str) -> None: ...

    @abstractmethod
    def remove(self, group: str) -> None: ...

    @abstractmethod
    def write_schemata(self, group: str, text: str) -> None:
        """Raises :class:`ResctrlError` when the kernel refuses a line."""

    def save_managed(self) -> None:  # noqa: B027 - optional hook
        """Persist :attr:`managed` (before a group is created: a helper
        killed after ``mkdir`` still knows the group is its own)."""

    def read(self) -> m.ReadResctrlReply:
        if not self.mounted():
            return m.ReadResctrlReply(mounted=False, resources=[], groups=[], managed=[])
        names = self.group_names()
        return m.ReadResctrlReply(
            mounted=True,
            resources=sorted(self.resources().values(), key=lambda r: r.name),
            groups=[m.ResctrlGroup(name=g, schemata=self.schemata(g)) for g in ["", *names]],
            managed=sorted(self.managed & set(names)),
        )

    def apply(self, req: m.SetResctrl) -> m.SetResctrlReply:
        """Remove, create, write (the request validated before)."""
        resources = self.resources()
        wanted = {g.name for g in req.groups}
        existing = self.group_names()
        doomed = [g for g in existing if g not in wanted and (req.force or g in self.managed)]
        if not req.force:
            busy = [g for g in doomed if self.has_tasks(g)]
            if busy:
                raise m.HelperError(
                    "invalid-argument", f"refusing to remove non-empty resctrl group {busy[0]!r}"
                )
        try:
            for name in doomed:
                self.remove(name)
                self.managed.discard(name)
            created = [g.name for g in req.groups if g.name and g.name not in existing]
            if created:
                self.managed.update(created)
                self.save_managed()
            for group in req.groups:
                if group.name in created:
                    self.create(group.name)
                if group.schemata:
                    self.write_schemata(group.name, format_schemata(group.schemata, resources))
        except ResctrlError as exc:
            raise m.HelperError("hardware-error", str(exc)) from None
        finally:
            self.save_managed()
        return m.SetResctrlReply(groups=sorted(wanted), removed=sorted(doomed))


class FsResctrl(Resctrl):
    """The kernel's resctrl under ``<root>/sys/fs/resctrl``; the groups the
    helper created are recorded in ``managed_file`` (the helper's state, not
    resctrl: the kernel takes no other file there)."""

    def __init__(self, root: Path, managed_file: Path | None = None) -> None:
        super().__init__()
        self.root = Path(root)
        self.base = self.root / "sys" / "fs" / "resctrl"
        self.managed_file = managed_file
        if managed_file is not None:
            try:
                text = managed_file.read_text(encoding="ascii")[: 64 * 1024]
            except (OSError, UnicodeDecodeError):
                text = ""
            self.managed = {n for n in text.split() if GROUP_NAME.match(n)}

    def save_managed(self) -> None:
        if self.managed_file is None:
            return
        tmp = self.managed_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{n}\n" for n in sorted(self.managed)), encoding="ascii")
        os.replace(tmp, self.managed_file)

    def _dir(self, group: str) -> Path:
        if group and (not GROUP_NAME.match(group) or group in RESERVED_NAMES):
            raise ValueError(f"bad resctrl group name {group!r}")
        return self.base / group if group else self.base

    def mounted(self) -> bool:
        return (self.base / "info").is_dir() and (self.base / "schemata").is_file()

    def _read(self, path: Path) -> str:
        with open(path, "rb") as f:
            return f.read(MAX_INFO_FILE).decode("ascii", "replace").strip()

    def _mbps(self) -> bool:
        try:
            with open(self.root / "proc" / "mounts", "rb") as f:
                text = f.read(1024 * 1024).decode("utf-8", "replace")
        except OSError:
            return False
        return any(
            line.split()[2:3] == ["resctrl"] and "mba_MBps" in line for line in text.splitlines()
        )

    def resources(self) -> dict[str, m.ResctrlResource]:
        try:
            root = self._read(self.base / "schemata")
        except OSError:
            return {}
        ids: dict[str, list[int]] = {}
        for line in root.splitlines():
            name, _, cells = line.strip().partition(":")
            ids[name] = sorted(
                int(c.partition("=")[0]) for c in cells.split(";") if c.partition("=")[0].isdigit()
            )
        out: dict[str, m.ResctrlResource] = {}
        for name, cache_ids in ids.items():
            info = self.base / "info" / name
            if not GROUP_NAME.match(name) or not info.is_dir():
                continue
            try:
                closids = int(self._read(info / "num_closids"))
                if (info / "cbm_mask").exists():
                    out[name] = m.ResctrlResource(
                        name=name,
                        cache_ids=cache_ids,
                        num_closids=closids,
                        cbm_mask=int(self._read(info / "cbm_mask"), 16),
                        min_cbm_bits=int(self._read(info / "min_cbm_bits")),
                    )
                else:
                    out[name] = m.ResctrlResource(
                        name=name,
                        cache_ids=cache_ids,
                        num_closids=closids,
                        bandwidth_gran=int(self._read(info / "bandwidth_gran")),
                        min_bandwidth=int(self._read(info / "min_bandwidth")),
                        mbps=self._mbps(),
                    )
            except (OSError, ValueError):
                continue
        return out

    def group_names(self) -> list[str]:
        try:
            entries = sorted(os.listdir(self.base))
        except OSError:
            return []
        return [
            e
            for e in entries
            if GROUP_NAME.match(e)
            and e not in RESERVED_NAMES
            and (self.base / e / "schemata").is_file()
        ]

    def schemata(self, group: str) -> dict[str, dict[int, int]]:
        try:
            return parse_schemata(self._read(self._dir(group) / "schemata"), self.resources())
        except OSError:
            return {}

    def has_tasks(self, group: str) -> bool:
        try:
            return bool(self._read(self._dir(group) / "tasks"))
        except OSError:
            return False

    def create(self, group: str) -> None:
        try:
            os.mkdir(self._dir(group))
        except FileExistsError:
            pass
        except OSError as exc:
            raise ResctrlError(
                f"failed to create resctrl group {group!r}: {exc.strerror}"
            ) from None

    def remove(self, group: str) -> None:
        try:
            os.rmdir(self._dir(group))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ResctrlError(
                f"failed to remove resctrl group {group!r}: {exc.strerror}"
            ) from None

    def write_schemata(self, group: str, text: str) -> None:
        path = self._dir(group) / "schemata"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, text.encode("ascii"))
            finally:
                os.close(fd)
        except OSError as exc:
            status = ""
            with contextlib.suppress(OSError):
                status = self._read(self.base / "info" / "last_cmd_status")
            raise ResctrlError(
                f"resctrl group {group!r}: writing schemata {text.strip()!r} failed: "
                f"{os.strerror(exc.errno or errno.EIO)}{f' ({status})' if status else ''}"
            ) from None
