"""The ``none`` backend: SST is not supported; every SST call fails.

sysfs knobs (C-states, cpufreq, uncore) still work: they do not need SST.
"""

from __future__ import annotations

import errno
from typing import NoReturn

from nri_sst.backends.base import (
    Backend,
    ClosParam,
    CorePower,
    LevelInfo,
    PerfLevels,
    TurboFreqInfo,
)

NOT_SUPPORTED = "SST not supported"


def _fail() -> NoReturn:
    raise OSError(errno.ENODEV, NOT_SUPPORTED)


class NoneBackend(Backend):
    name = "none"
    supported = False

    def api_version(self) -> int:
        _fail()

    def count_instances(self, package: int) -> int:
        _fail()

    def phy_id(self, cpu: int) -> int:
        _fail()

    def perf_levels(self, package: int, punit: int) -> PerfLevels:
        _fail()

    def level_cpu_mask(self, package: int, punit: int, level: int) -> int:
        _fail()

    def level_info(self, package: int, punit: int, level: int) -> LevelInfo:
        _fail()

    def turbo_freq_info(self, package: int, punit: int, level: int) -> TurboFreqInfo:
        _fail()

    def core_power_get(self, package: int, punit: int) -> CorePower:
        _fail()

    def core_power_set(self, package: int, punit: int, enable: bool, ordered: bool) -> None:
        _fail()

    def clos_param_get(self, package: int, punit: int, clos: int) -> ClosParam:
        _fail()

    def clos_param_set(self, package: int, punit: int, clos: int, param: ClosParam) -> None:
        _fail()

    def clos_assoc_get(self, package: int, punit: int, core: int) -> int:
        _fail()

    def clos_assoc_set(self, package: int, punit: int, assoc: list[tuple[int, int]]) -> None:
        _fail()

    def perf_set_feature(self, package: int, punit: int, feature: int) -> None:
        _fail()

    def read_msr(self, cpu: int, msr: int) -> int:
        _fail()
