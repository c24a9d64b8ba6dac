"""How the kubelet turns Kubernetes CPU requests and limits into cgroup values.

The one home of these rules: the runtime simulator uses them to build
containers from Pod YAML, policies use them to read requests back.
"""

from __future__ import annotations

import enum
import math

MIN_SHARES = 2
SHARES_PER_CPU = 1024
CFS_PERIOD = 100_000
MIN_QUOTA = 1000


class QOSClass(enum.StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


def cpu_shares(milli_cpu: int) -> int:
    """The kubelet's ``MilliCPUToShares``."""
    return max(MIN_SHARES, milli_cpu * SHARES_PER_CPU // 1000)


def cpu_quota(milli_cpu: int, period: int = CFS_PERIOD) -> int:
    """The kubelet's ``milliCPUToQuota``; 0 means "no limit"."""
    if milli_cpu == 0:
        return 0
    return max(MIN_QUOTA, milli_cpu * period // 1000)


def shares_to_milli_cpu(shares: int) -> int:
    """The CPU request (mCPU) behind CFS ``shares``: the inverse of :func:`cpu_shares`
    (0 for the minimum, which the kubelet gives containers without a request)."""
    if shares <= MIN_SHARES:
        return 0
    return math.ceil(shares * 1000 / SHARES_PER_CPU)


def quota_to_milli_cpu(quota: int, period: int) -> int:
    """The CPU limit (mCPU) behind a CFS quota; 0 for no limit."""
    if quota <= 0 or period <= 0:
        return 0
    return quota * 1000 // period
