"""The CRD's schema of a ``BalloonsPolicy`` as the API server enforces it
(validation stage 1 of :mod:`nri_balloons.validation`): the enumerations,
minimums and durations, in the API server's wording
(``spec.x: Unsupported value: ...``).

The enumerations are also what ``scripts/gencrd.py`` writes into the CRD, so
that the API server and this decoder agree. Stages 2 and 3 (the agent's
``Validate()``, the policy's ``setConfig``) are in
:mod:`nri_balloons.validation`; composite balloons' checks in
:mod:`nri_balloons.composition`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nri_balloons.config import BalloonsPolicySpec
from nri_balloons.gofmt import quote

ALLOCATOR_PRIORITIES = ("high", "normal", "low", "none")
TOPOLOGY_LEVELS = ("", "system", "package", "die", "numa", "l2cache", "core", "thread")
LOAD_LEVELS = ("l2cache", "core")
CORE_TYPES = ("", "efficient", "performance")
IRQ_MODES = ("", "sink", "isolate")
TURBO_DOMAINS = ("package", "system")
COMPONENT_CREATIONS = ("", "all", "balance-balloons")
MEMORY_TYPES = ("DRAM", "PMEM", "HBM")
MEMORY_TYPE_RULE = {
    "rule": "self == 'DRAM' || self == 'HBM' || self == 'PMEM'",
    "messageExpression": '"invalid memory type: " + self + ", expected DRAM, HBM, or PMEM"',
}
"""The CRD's XValidation of each ``memoryTypes`` item (upstream's, case-sensitive)."""
RESOURCE_DOMAINS = ("cpu", "memory")
SCHED_POLICIES = ("", "none", "other", "fifo", "rr", "batch", "iso", "idle", "deadline")
SCHED_FLAGS = (
    "reset-on-fork",
    "reclaim",
    "dl-overrun",
    "keep-policy",
    "keep-params",
    "util-clamp-min",
    "util-clamp-max",
)
IO_CLASSES = ("", "none", "rt", "be", "idle")
TRACING_COLLECTORS = ("", "otlp-http", "otlp-grpc")
METRICS_EXPORTERS = ("", "prometheus", "otlp-http", "otlp-grpc")
LOG_EXPORTERS = ("", "otlp-http", "otlp-grpc")
PCT_PRIORITIES = ("", "high", "low")

_DURATION = re.compile(r"^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$")


def _supported(values: Sequence[str]) -> str:
    return ", ".join(quote(v) for v in values if v)


def schema_errors(s: BalloonsPolicySpec) -> list[str]:
    """What the API server rejects in ``s`` (enums, minimums, durations), in
    its words, in the order of the fields."""
    errors: list[str] = []

    def enum(path: str, value: str, allowed: Sequence[str]) -> None:
        if value not in allowed:
            errors.append(
                f"{path}: Unsupported value: {quote(value)}:"
                f" supported values: {_supported(allowed)}"
            )

    def minimum(path: str, value: int | None) -> None:
        if value is not None and value < 0:
            errors.append(
                f"{path}: Invalid value: {value}:"
                f" {path} in body should be greater than or equal to 0"
            )

    def duration(path: str, value: str) -> None:
        if value and not _DURATION.match(value):
            errors.append(
                f"{path}: Invalid value: {quote(value)}: {path} in body must be of type duration:"
                f" {quote(value)}"
            )

    for name in ("availableResources", "reservedResources"):
        resources = s.available_resources if name[0] == "a" else s.reserved_resources
        for key in resources:
            enum(f"spec.{name}", key, RESOURCE_DOMAINS)
    enum("spec.turboDomain", s.turbo_domain, TURBO_DOMAINS)
    for i, bt in enumerate(s.balloon_types):
        at = f"spec.balloonTypes[{i}]"
        enum(f"{at}.allocatorPriority", bt.allocator_priority, ALLOCATOR_PRIORITIES)
        enum(f"{at}.shareIdleCPUsInSame", bt.share_idle_cpus_in_same, TOPOLOGY_LEVELS)
        enum(f"{at}.preferCoreType", bt.prefer_core_type, CORE_TYPES)
        enum(f"{at}.irqMode", bt.irq_mode, IRQ_MODES)
        for j, mem_type in enumerate(bt.memory_types):
            if mem_type not in MEMORY_TYPES:  # MEMORY_TYPE_RULE, in the API server's words
                errors.append(
                    f"{at}.memoryTypes[{j}]: Invalid value: {quote(mem_type)}: invalid memory"
                    f" type: {mem_type}, expected DRAM, HBM, or PMEM"
                )
    for i, sc in enumerate(s.scheduling_classes):
        at = f"spec.schedulingClasses[{i}]"
        enum(f"{at}.policy", sc.policy, SCHED_POLICIES)
        for j, flag in enumerate(sc.flags):
            enum(f"{at}.flags[{j}]", flag, SCHED_FLAGS)
        enum(f"{at}.ioClass", sc.io_class, IO_CLASSES)
        for what in ("runtime", "deadline", "period"):
            minimum(f"{at}.{what}", getattr(sc, what))
    for i, cc in enumerate(s.cpu_classes):
        at = f"spec.cpuClasses[{i}]"
        minimum(f"{at}.energyPerformancePreference", cc.energy_performance_preference)
        minimum(f"{at}.turboPriority", cc.turbo_priority)
    ins, at = s.instrumentation, "spec.instrumentation"
    enum(f"{at}.tracingCollector", ins.tracing_collector, TRACING_COLLECTORS)
    enum(f"{at}.metricsExporter", ins.metrics_exporter, METRICS_EXPORTERS)
    enum(f"{at}.logExporter", ins.log_exporter, LOG_EXPORTERS)
    duration(f"{at}.reportPeriod", ins.report_period)
    duration(f"{at}.logExportPeriod", ins.log_export_period)
    window = "spec.agent.nodeResourceTopologyWindow"
    duration(window, s.agent.node_resource_topology_window)
    if s.agent.node_resource_topology_window.startswith("-"):
        errors.append(
            f"{window}: Invalid value: {quote(s.agent.node_resource_topology_window)}:"
            " must not be negative"
        )
    return errors
