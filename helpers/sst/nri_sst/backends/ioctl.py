"""The ``/dev/isst_interface`` ABI: ioctl numbers and struct layouts (sst.md §1.2-§1.5).

This module is the one home of the numbers. Every struct is a :class:`Layout`
(little-endian ``struct`` format with explicit padding, field names as in
``linux/isst_if.h``); ``tests/unit/nri_sst/test_ioctl_uapi.py`` compiles the
kernel header with gcc and compares every size, offset and ioctl number with
the ones here.

:class:`IsstDevice` opens the device and issues ``fcntl.ioctl`` with a
zero-initialised, full-size, mutable buffer (even ``_IOR`` ioctls read their
keys from it, §1.2). The syscall is injectable (``ioctl_fn``) so the backends
can be tested against a fake kernel on machines without SST hardware.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# ------------------------------------------------------------------ ioctl numbers

ISST_IF_MAGIC = 0xFE
_IOC_WRITE = 1
_IOC_READ = 2
_PTR_SIZE = 8
"""The header passes ``struct X *`` to ``_IOR``/``_IOWR``: the encoded size is a pointer's."""


def _ioc(direction: int, nr: int, size: int = _PTR_SIZE) -> int:
    return (direction << 30) | (size << 16) | (ISST_IF_MAGIC << 8) | nr


def _ior(nr: int) -> int:
    return _ioc(_IOC_READ, nr)


def _iow(nr: int) -> int:
    return _ioc(_IOC_WRITE, nr)


def _iowr(nr: int) -> int:
    return _ioc(_IOC_READ | _IOC_WRITE, nr)


ISST_IF_GET_PLATFORM_INFO = _ior(0)
ISST_IF_GET_PHY_ID = _iowr(1)
ISST_IF_IO_CMD = _iow(2)
ISST_IF_MBOX_COMMAND = _iowr(3)
ISST_IF_MSR_COMMAND = _iowr(4)
ISST_IF_COUNT_TPMI_INSTANCES = _ior(5)
ISST_IF_CORE_POWER_STATE = _iowr(6)
ISST_IF_CLOS_PARAM = _iowr(7)
ISST_IF_CLOS_ASSOC = _iowr(8)
ISST_IF_PERF_LEVELS = _iowr(9)
ISST_IF_PERF_SET_LEVEL = _iow(10)
ISST_IF_PERF_SET_FEATURE = _iow(11)
ISST_IF_GET_PERF_LEVEL_INFO = _ior(12)
ISST_IF_GET_PERF_LEVEL_CPU_MASK = _ior(13)
ISST_IF_GET_BASE_FREQ_INFO = _ior(14)
ISST_IF_GET_BASE_FREQ_CPU_MASK = _ior(15)
ISST_IF_GET_TURBO_FREQ_INFO = _ior(16)
ISST_IF_GET_PERF_LEVEL_FABRIC_INFO = _ior(17)

IOCTLS: dict[str, int] = {
    "ISST_IF_GET_PLATFORM_INFO": ISST_IF_GET_PLATFORM_INFO,
    "ISST_IF_GET_PHY_ID": ISST_IF_GET_PHY_ID,
    "ISST_IF_IO_CMD": ISST_IF_IO_CMD,
    "ISST_IF_MBOX_COMMAND": ISST_IF_MBOX_COMMAND,
    "ISST_IF_MSR_COMMAND": ISST_IF_MSR_COMMAND,
    "ISST_IF_COUNT_TPMI_INSTANCES": ISST_IF_COUNT_TPMI_INSTANCES,
    "ISST_IF_CORE_POWER_STATE": ISST_IF_CORE_POWER_STATE,
    "ISST_IF_CLOS_PARAM": ISST_IF_CLOS_PARAM,
    "ISST_IF_CLOS_ASSOC": ISST_IF_CLOS_ASSOC,
    "ISST_IF_PERF_LEVELS": ISST_IF_PERF_LEVELS,
    "ISST_IF_PERF_SET_LEVEL": ISST_IF_PERF_SET_LEVEL,
    "ISST_IF_PERF_SET_FEATURE": ISST_IF_PERF_SET_FEATURE,
    "ISST_IF_GET_PERF_LEVEL_INFO": ISST_IF_GET_PERF_LEVEL_INFO,
    "ISST_IF_GET_PERF_LEVEL_CPU_MASK": ISST_IF_GET_PERF_LEVEL_CPU_MASK,
    "ISST_IF_GET_BASE_FREQ_INFO": ISST_IF_GET_BASE_FREQ_INFO,
    "ISST_IF_GET_BASE_FREQ_CPU_MASK": ISST_IF_GET_BASE_FREQ_CPU_MASK,
    "ISST_IF_GET_TURBO_FREQ_INFO": ISST_IF_GET_TURBO_FREQ_INFO,
    "ISST_IF_GET_PERF_LEVEL_FABRIC_INFO": ISST_IF_GET_PERF_LEVEL_FABRIC_INFO,
}
IOCTL_NAMES: dict[int, str] = {v: k for k, v in IOCTLS.items()}

TRL_MAX_BUCKETS = 8
TRL_MAX_LEVELS = 6
MAX_FABRIC_COUNT = 8
MAX_CMDS_PER_IOCTL = 64

# ------------------------------------------------------------------ struct layouts


@dataclass(frozen=True)
class Field:
    """``name`` as in C (``cpu_map[0].logical_cpu`` for an element of a trailing array);
    ``code`` a ``struct`` code (``B H I Q b``) or ``x`` for padding; ``count`` > 1 for arrays."""

    name: str
    code: str
    count: int = 1


class Record:
    """An unpacked struct: ``rec["field"]`` for scalars, ``rec.array("field")`` for arrays."""

    def __init__(self, values: dict[str, tuple[int, ...]]) -> None:
        self._values = values

    def __getitem__(self, name: str) -> int:
        v = self._values[name]
        if len(v) != 1:
            raise TypeError(f"{name} is an array; use .array()")
        return v[0]

    def array(self, name: str) -> tuple[int, ...]:
        return self._values[name]

    def rows(self, name: str, width: int) -> tuple[tuple[int, ...], ...]:
        """A 2-D array ``[rows][width]`` (C row-major)."""
        flat = self._values[name]
        return tuple(flat[i : i + width] for i in range(0, len(flat), width))

    def asdict(self) -> dict[str, int | tuple[int, ...]]:
        return {k: (v[0] if len(v) == 1 else v) for k, v in self._values.items()}


class Layout:
    """One C struct: a little-endian format with explicit padding and named fields."""

    def __init__(self, c_name: str, fields: list[Field]) -> None:
        self.c_name = c_name
        self.fields = tuple(fields)
        self.format = "<" + "".join(
            f"{f.count}{f.code}" if f.count > 1 else f.code for f in self.fields
        )
        self.struct = struct.Struct(self.format)
        self.size = self.struct.size
        offsets: dict[str, int] = {}
        fmt = "<"
        for f in self.fields:
            if f.code != "x":
                offsets[f.name] = struct.calcsize(fmt)
            fmt += f"{f.count}{f.code}"
        self.offsets: Mapping[str, int] = offsets

    def named(self) -> Iterator[Field]:
        return (f for f in self.fields if f.code != "x")

    def pack(
        self, values: Mapping[str, int | tuple[int, ...] | list[int]] | None = None
    ) -> bytearray:
        """A full-size mutable buffer; fields not given are 0."""
        values = values or {}
        unknown = set(values) - set(self.offsets)
        if unknown:
            raise KeyError(f"{self.c_name}: unknown fields {sorted(unknown)}")
        flat: list[int] = []
        for f in self.named():
            v = values.get(f.name, 0)
            items = [v] if isinstance(v, int) else list(v)
            if len(items) > f.count:
                raise ValueError(f"{self.c_name}.{f.name}: {len(items)} > {f.count} values")
            flat.extend(items + [0] * (f.count - len(items)))
        return bytearray(self.struct.pack(*flat))

    def unpack(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> Record:
        flat = self.struct.unpack_from(buf, offset)
        out: dict[str, tuple[int, ...]] = {}
        i = 0
        for f in self.named():
            out[f.name] = tuple(flat[i : i + f.count])
            i += f.count
        return Record(out)


def _u8(*names: str) -> list[Field]:
    return [Field(n, "B") for n in names]


def _u16(*names: str) -> list[Field]:
    return [Field(n, "H") for n in names]


# §1.3: legacy and common. The multi-command structs end in ``x[1]``; the
# header layouts below are the fixed part, the element layouts follow it.
PLATFORM_INFO = Layout(
    "isst_if_platform_info",
    [
        *_u16("api_version", "driver_version", "max_cmds_per_ioctl"),
        *_u8("mbox_supported", "mmio_supported"),
    ],
)
CPU_MAP = Layout("isst_if_cpu_map", [Field("logical_cpu", "I"), Field("physical_cpu", "I")])
CPU_MAPS = Layout("isst_if_cpu_maps", [Field("cmd_count", "I")])
IO_REG = Layout(
    "isst_if_io_reg",
    [Field("read_write", "I"), Field("logical_cpu", "I"), Field("reg", "I"), Field("value", "I")],
)
IO_REGS = Layout("isst_if_io_regs", [Field("req_count", "I")])
MBOX_CMD = Layout(
    "isst_if_mbox_cmd",
    [
        Field("logical_cpu", "I"),
        Field("parameter", "I"),
        Field("req_data", "I"),
        Field("resp_data", "I"),
        Field("command", "H"),
        Field("sub_command", "H"),
        Field("reserved", "I"),
    ],
)
MBOX_CMDS = Layout("isst_if_mbox_cmds", [Field("cmd_count", "I")])
MSR_CMD = Layout(
    "isst_if_msr_cmd",
    [Field("read_write", "I"), Field("logical_cpu", "I"), Field("msr", "Q"), Field("data", "Q")],
)
MSR_CMDS = Layout("isst_if_msr_cmds", [Field("cmd_count", "I"), Field("", "x", 4)])

# §1.4: TPMI.
TPMI_INSTANCE_COUNT = Layout(
    "isst_tpmi_instance_count", [*_u8("socket_id", "count"), Field("valid_mask", "H")]
)
CORE_POWER = Layout(
    "isst_core_power",
    _u8("get_set", "socket_id", "power_domain_id", "enable", "supported", "priority_type"),
)
CLOS_PARAM = Layout(
    "isst_clos_param",
    [
        *_u8("get_set", "socket_id", "power_domain_id", "clos"),
        *_u16("min_freq_mhz", "max_freq_mhz"),
        Field("prop_prio", "B"),
        Field("", "x"),
    ],
)
CLOS_ASSOC = Layout(
    "isst_if_clos_assoc",
    [*_u8("socket_id", "power_domain_id"), *_u16("logical_cpu", "clos")],
)
CLOS_ASSOC_CMDS = Layout("isst_if_clos_assoc_cmds", _u16("cmd_count", "get_set", "punit_cpu_map"))
PERF_LEVEL_INFO = Layout(
    "isst_perf_level_info",
    _u8(
        "socket_id",
        "power_domain_id",
        "max_level",
        "feature_rev",
        "level_mask",
        "current_level",
        "feature_state",
        "locked",
        "enabled",
        "sst_tf_support",
        "sst_bf_support",
    ),
)
PERF_LEVEL_CONTROL = Layout("isst_perf_level_control", _u8("socket_id", "power_domain_id", "level"))
PERF_FEATURE_CONTROL = Layout(
    "isst_perf_feature_control", _u8("socket_id", "power_domain_id", "feature")
)
PERF_LEVEL_DATA_INFO = Layout(
    "isst_perf_level_data_info",
    [
        *_u8("socket_id", "power_domain_id"),
        *_u16(
            "level",
            "tdp_ratio",
            "base_freq_mhz",
            "base_freq_avx2_mhz",
            "base_freq_avx512_mhz",
            "base_freq_amx_mhz",
            "thermal_design_power_w",
            "tjunction_max_c",
            "max_memory_freq_mhz",
            "cooling_type",
            "p0_freq_mhz",
            "p1_freq_mhz",
            "pn_freq_mhz",
            "pm_freq_mhz",
            "p0_fabric_freq_mhz",
            "p1_fabric_freq_mhz",
            "pn_fabric_freq_mhz",
            "pm_fabric_freq_mhz",
            "max_buckets",
            "max_trl_levels",
        ),
        Field("bucket_core_counts", "H", TRL_MAX_BUCKETS),
        Field("trl_freq_mhz", "H", TRL_MAX_LEVELS * TRL_MAX_BUCKETS),
    ],
)
PERF_LEVEL_CPU_MASK = Layout(
    "isst_perf_level_cpu_mask",
    [
        *_u8("socket_id", "power_domain_id", "level", "punit_cpu_map"),
        Field("", "x", 4),
        Field("mask", "Q"),
        Field("cpu_buffer_size", "H"),
        Field("cpu_buffer", "b"),
        Field("", "x", 5),
    ],
)
BASE_FREQ_INFO = Layout(
    "isst_base_freq_info",
    [
        *_u8("socket_id", "power_domain_id"),
        *_u16(
            "level",
            "high_base_freq_mhz",
            "low_base_freq_mhz",
            "tjunction_max_c",
            "thermal_design_power_w",
        ),
    ],
)
TURBO_FREQ_INFO = Layout(
    "isst_turbo_freq_info",
    [
        *_u8("socket_id", "power_domain_id"),
        *_u16("level", "max_clip_freqs", "max_buckets", "max_trl_levels"),
        Field("lp_clip_freq_mhz", "H", TRL_MAX_LEVELS),
        Field("bucket_core_counts", "H", TRL_MAX_BUCKETS),
        Field("trl_freq_mhz", "H", TRL_MAX_LEVELS * TRL_MAX_BUCKETS),
    ],
)
PERF_LEVEL_FABRIC_INFO = Layout(
    "isst_perf_level_fabric_info",
    [
        *_u8("socket_id", "power_domain_id"),
        *_u16("level", "max_fabrics"),
        Field("p0_fabric_freq_mhz", "H", MAX_FABRIC_COUNT),
        Field("p1_fabric_freq_mhz", "H", MAX_FABRIC_COUNT),
        Field("pm_fabric_freq_mhz", "H", MAX_FABRIC_COUNT),
    ],
)


@dataclass(frozen=True)
class Multi:
    """A multi-command struct: ``header`` then ``array`` elements of ``element``."""

    header: Layout
    array: str
    element: Layout

    @property
    def c_name(self) -> str:
        return self.header.c_name

    def size(self, n: int = 1) -> int:
        """``sizeof`` in C is ``size(1)`` (the arrays are declared ``[1]``)."""
        return self.header.size + n * self.element.size

    def pack(
        self,
        header: Mapping[str, int],
        elements: list[Mapping[str, int | tuple[int, ...] | list[int]]],
    ) -> bytearray:
        buf = self.header.pack(header)
        for e in elements or [{}]:
            buf += self.element.pack(e)
        return buf

    def unpack(self, buf: bytes | bytearray, n: int) -> tuple[Record, list[Record]]:
        head = self.header.unpack(buf)
        return head, [
            self.element.unpack(buf, self.header.size + i * self.element.size) for i in range(n)
        ]


CPU_MAPS_CMD = Multi(CPU_MAPS, "cpu_map", CPU_MAP)
IO_REGS_CMD = Multi(IO_REGS, "io_reg", IO_REG)
MBOX_CMDS_CMD = Multi(MBOX_CMDS, "mbox_cmd", MBOX_CMD)
MSR_CMDS_CMD = Multi(MSR_CMDS, "msr_cmd", MSR_CMD)
CLOS_ASSOC_CMDS_CMD = Multi(CLOS_ASSOC_CMDS, "assoc_info", CLOS_ASSOC)

LAYOUTS: tuple[Layout, ...] = (
    PLATFORM_INFO,
    CPU_MAP,
    IO_REG,
    MBOX_CMD,
    MSR_CMD,
    TPMI_INSTANCE_COUNT,
    CORE_POWER,
    CLOS_PARAM,
    CLOS_ASSOC,
    PERF_LEVEL_INFO,
    PERF_LEVEL_CONTROL,
    PERF_FEATURE_CONTROL,
    PERF_LEVEL_DATA_INFO,
    PERF_LEVEL_CPU_MASK,
    BASE_FREQ_INFO,
    TURBO_FREQ_INFO,
    PERF_LEVEL_FABRIC_INFO,
)
"""Every fixed-size struct (the multi-command headers are in :data:`MULTIS`)."""
MULTIS: tuple[Multi, ...] = (
    CPU_MAPS_CMD,
    IO_REGS_CMD,
    MBOX_CMDS_CMD,
    MSR_CMDS_CMD,
    CLOS_ASSOC_CMDS_CMD,
)

# ------------------------------------------------------------------ the device

IoctlFn = Callable[[int, int, bytearray], int]
"""``(fd, request, buf) -> ret``: the syscall; mutates ``buf``; raises ``OSError``."""

DEVICE = Path("dev") / "isst_interface"


def _real_ioctl(fd: int, request: int, buf: bytearray) -> int:
    ret: int = fcntl.ioctl(fd, request, buf, True)
    return ret


class IsstDevice:
    """``<host-root>/dev/isst_interface``, opened per call as goresctrl does (§3).

    ``ioctl_fn`` replaces the syscall (tests use a fake kernel); with it the
    device file is not opened at all. Errors are ``OSError`` with the kernel's
    errno (every TPMI failure is ``ENOTTY``, §1.1), message naming the ioctl.
    """

    def __init__(self, host_root: Path | str = "/", ioctl_fn: IoctlFn | None = None) -> None:
        self.path = Path(host_root) / DEVICE
        self._ioctl = ioctl_fn

    def ioctl(self, request: int, buf: bytearray) -> int:
        name = IOCTL_NAMES.get(request, f"{request:#x}")
        try:
            if self._ioctl is not None:
                return self._ioctl(-1, request, buf)
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                return _real_ioctl(fd, request, buf)
            finally:
                os.close(fd)
        except OSError as exc:
            code = exc.errno if exc.errno is not None else errno.EIO
            raise OSError(code, f"{name}: {os.strerror(code)}") from None

    def call(self, request: int, layout: Layout, values: Mapping[str, int]) -> Record:
        """One fixed-size struct in, the same struct out."""
        buf = layout.pack(values)
        self.ioctl(request, buf)
        return layout.unpack(buf)

    def multi(
        self,
        request: int,
        cmd: Multi,
        elements: list[Mapping[str, int | tuple[int, ...] | list[int]]],
        header: Mapping[str, int] | None = None,
        count_field: str = "cmd_count",
    ) -> list[Record]:
        """A multi-command ioctl. A short count (a mid-batch failure, §1.1) is ``EIO``."""
        n = len(elements)
        if not 1 <= n <= MAX_CMDS_PER_IOCTL:
            raise OSError(errno.EINVAL, f"{cmd.c_name}: {n} commands (1..64)")
        buf = cmd.pack({count_field: n, **(header or {})}, elements)
        ret = self.ioctl(request, buf)
        if request != ISST_IF_CLOS_ASSOC and ret != n:
            name = IOCTL_NAMES.get(request, f"{request:#x}")
            raise OSError(errno.EIO, f"{name}: {ret} of {n} commands done")
        return cmd.unpack(buf, n)[1]
