"""What the balloons policy shows of itself: Prometheus metrics (reference §15)
and the state ``nri-resource-policy inspect`` prints.

Both read :class:`~nri_balloons.policy.BalloonsPolicy` as it is, on the NRI
event loop between two requests (the host calls them from its instrumentation
endpoint), and return plain data; the framework renders it.

Metrics: one gauge ``balloons`` in ``cores`` (exported
``nri_policy_balloons_cores``, help ``CPUs``), one sample per top-level
balloon, value = its CPU count, with upstream's labels in upstream's order
(:data:`BALLOON_LABELS`). Topology names are the CPU tree's (``p0``,
``p0d0``, ``p0d0n1``), listed in tree order.

Inspect: ``balloons`` (one row per top-level balloon), ``containers`` (the
balloon of each container id, joined by ``inspect`` with the host's cpusets)
and ``cpus`` (one row per online CPU: its balloon, or ``free``/``reserved``/
``not allowed``, its CPU class). Priority Core Turbo adds a ``clos`` per CPU
and a ``punit`` per CPU and balloon, a ``punits`` table and ``pct_mode``/
``pct_degraded``, when the cpuClass handler's ``pct`` allocator reports them
(``clos_of(cpu)``, ``punit_key(cpu)``, ``punits``, ``mode``); a CPU whose
CLOS is not known for sure has no ``clos`` key, so without PCT the columns are
absent. ``clos`` is what the helper did: SST associates whole cores, so a CPU's
``clos`` is its core's, which may differ from what its ``class`` asks for when
two classes share a core (the plugin logs how it resolved it).

Frequencies without privileged pods (:mod:`nri_balloons.busyfreq`): with
``--sst-helper``, each scrape first takes one ``ReadFrequency`` of every
balloon CPU, CLOS bounds included (:func:`before_scrape`), and shows, for
the interval since that consumer's previous reading:

* ``nri_policy_balloons_busy_mhz`` (help ``Busy MHz``), one sample per
  top-level balloon with at least one busy CPU: turbostat's ``Bzy_MHz`` of its
  CPUs (``TSC_MHz * ΣΔAPERF / ΣΔMPERF``), labels ``balloon``,
  ``balloon_type``, ``cpus``, ``source``;
* ``nri_policy_balloons_clos_min_mhz`` and ``nri_policy_balloons_clos_max_mhz``
  (help ``CLOS min/max MHz``), one sample per punit and CLOS 0..3 as the
  hardware holds them, labels ``package``, ``punit``, ``clos``, ``source``;
* ``nri_policy_balloons_busy_interval_seconds``: the interval those cover.

``source`` is the helper's backend: ``source="sim"`` marks figures the SST
helper's model computed (simulated), not hardware. The busy families need
two good readings from the same helper process, the CLOS ones the last
reading: without them (no helper, a dead, slow or refusing one, the first
scrape) they are absent. ``inspect`` gets the same as a
``busy_mhz`` column of ``balloons``, ``clos0_mhz``..``clos3_mhz``
(``min-max``) and ``cp_enabled`` columns of ``punits``, ``frequency_source``
and, when simulated, ``simulated_columns`` naming those columns.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import msgspec
from nri_framework import cpumap, cpuset
from nri_framework.contract import MetricFamily
from nri_framework.topology import TreeNode

from nri_balloons.balloon import Balloon
from nri_balloons.busyfreq import BusyFrequency, Interval

if TYPE_CHECKING:
    from nri_balloons.policy import BalloonsPolicy

BALLOON_LABELS = (
    "balloon_type",
    "cpu_class",
    "cpus_min",
    "cpus_max",
    "balloon",
    "groups",
    "cpus",
    "cpus_count",
    "numas",
    "numas_count",
    "dies",
    "dies_count",
    "packages",
    "packages_count",
    "sharedidlecpus",
    "sharedidlecpus_count",
    "cpus_allowed",
    "cpus_allowed_count",
    "mems",
    "containers",
    "tot_req_millicpu",
)
"""Labels of ``nri_policy_balloons_cores``, exactly upstream's (reference §15)."""

_LOCATION_LEVELS = ("package", "die", "numa")


def locations(root: TreeNode, cpus: int) -> dict[str, list[str]]:
    """Names of the packages, dies and NUMA nodes of the CPU tree that
    ``cpus`` touches, in tree order (upstream ``CpuLocations``)."""
    out: dict[str, list[str]] = {level: [] for level in _LOCATION_LEVELS}
    stack = [root]
    while stack:
        node = stack.pop()
        if not node.cpus & cpus:
            continue
        if node.level in out:
            out[node.level].append(node.name)
            if node.level == "numa":
                continue  # nothing below is reported
        stack.extend(reversed(node.children))
    return out


def balloon_sample(policy: BalloonsPolicy, bln: Balloon) -> tuple[str, ...]:
    """The label values of one balloon, in :data:`BALLOON_LABELS` order."""
    bdef = bln.bdef
    loc = locations(policy.topology.tree(), bln.cpus)
    allowed = bln.cpus | bln.shared_idle
    groups = sorted(g for g, n in bln.groups.items() if n > 0)
    values = {
        "balloon_type": bdef.name,
        "cpu_class": bdef.cpu_class,
        "cpus_min": str(bdef.min_cpus),
        "cpus_max": str(bdef.max_cpus),
        "balloon": bln.name,
        "groups": ",".join(groups),
        "cpus": cpuset.format(bln.cpus),
        "cpus_count": str(bln.cpus.bit_count()),
        "numas": ",".join(loc["numa"]),
        "numas_count": str(len(loc["numa"])),
        "dies": ",".join(loc["die"]),
        "dies_count": str(len(loc["die"])),
        "packages": ",".join(loc["package"]),
        "packages_count": str(len(loc["package"])),
        "sharedidlecpus": cpuset.format(bln.shared_idle),
        "sharedidlecpus_count": str(bln.shared_idle.bit_count()),
        "cpus_allowed": cpuset.format(allowed),
        "cpus_allowed_count": str(allowed.bit_count()),
        "mems": cpuset.format(bln.mems),
        "containers": ",".join(sorted(m.pretty for m in bln.members.values())),
        "tot_req_millicpu": str(bln.requested),
    }
    return tuple(values[label] for label in BALLOON_LABELS)


BUSY_LABELS = ("balloon", "balloon_type", "cpus", "source")
"""Labels of ``nri_policy_balloons_busy_mhz``."""
CLOS_LABELS = ("package", "punit", "clos", "source")
"""Labels of ``nri_policy_balloons_clos_{min,max}_mhz``."""
SCRAPE_CONSUMERS = {"/metrics": "metrics", "/debug/state": "inspect"}


def balloon_cpus(policy: BalloonsPolicy) -> list[int]:
    """Every CPU of a top-level balloon: what one scrape's reading covers."""
    cpus = 0
    for bln in policy.balloons:
        cpus |= bln.cpus
    return cpuset.ids(cpus)


def before_scrape(
    policy: BalloonsPolicy | None, busy: BusyFrequency, path: str
) -> Coroutine[Any, Any, None] | None:
    """The reading a scrape of ``path`` waits for (None: nothing to read)."""
    consumer = SCRAPE_CONSUMERS.get(path)
    if policy is None or policy.config is None or consumer is None:
        return None
    endpoint = policy.cpu_classes.writer.endpoint
    if not endpoint:
        return None
    return busy.refresh(consumer, endpoint, balloon_cpus(policy))


def busy_metrics(policy: BalloonsPolicy, interval: Interval) -> list[MetricFamily]:
    """The frequency families of one interval (none when it has no figures)."""
    after = interval.after
    seconds = interval.seconds
    if after is None:
        return []
    source = after.backend or "unknown"
    busy: list[tuple[tuple[str, ...], float]] = []
    for bln in policy.balloons if seconds is not None else ():
        mhz = interval.busy_mhz(cpuset.ids(bln.cpus))
        if mhz is not None:
            values = (bln.name, bln.bdef.name, cpuset.format(bln.cpus), source)
            busy.append((values, round(mhz, 1)))
    lows: list[tuple[tuple[str, ...], float]] = []
    highs: list[tuple[tuple[str, ...], float]] = []
    for pu in after.punits:
        for cl in pu.clos:
            labels = (str(pu.package), str(pu.punit), str(cl.clos), source)
            lows.append((labels, cl.min_khz / 1000))
            highs.append((labels, cl.max_khz / 1000))
    out = []
    if busy and seconds is not None:
        out.append(MetricFamily("balloons_busy", "Busy MHz", BUSY_LABELS, busy, unit="mhz"))
        out.append(
            MetricFamily(
                "balloons_busy_interval",
                "Seconds the busy MHz cover",
                ("source",),
                [((source,), round(seconds, 3))],
                unit="seconds",
            )
        )
    if lows:
        out.append(MetricFamily("balloons_clos_min", "CLOS min MHz", CLOS_LABELS, lows, "mhz"))
        out.append(MetricFamily("balloons_clos_max", "CLOS max MHz", CLOS_LABELS, highs, "mhz"))
    return out


def metrics(policy: BalloonsPolicy | None, busy: BusyFrequency | None = None) -> list[MetricFamily]:
    """The ``balloons`` gauge, and the frequency families of the last
    ``/metrics`` interval; no family before the policy has a configuration."""
    if policy is None or policy.config is None:
        return []
    samples = [
        (balloon_sample(policy, bln), float(bln.cpus.bit_count())) for bln in policy.balloons
    ]
    out = [MetricFamily("balloons", "CPUs", BALLOON_LABELS, samples, unit="cores")]
    if busy is not None:
        out += busy_metrics(policy, busy.interval("metrics"))
    return out


# --------------------------------------------------------------------------- inspect


def _class_name(policy: BalloonsPolicy, cpu: int) -> str:
    """The CPU class the handler assigned to ``cpu`` (its ``name@dN`` synthetic
    name is per turbo domain)."""
    name = policy.cpu_classes.cpu_class.get(cpu, "")
    return name.rsplit("@d", 1)[0] if "@d" in name else name


def _pct(policy: BalloonsPolicy) -> Any:
    """The PCT allocator when it reports CLOS associations, else ``None``."""
    pct = getattr(policy.cpu_classes, "pct", None)
    return pct if callable(getattr(pct, "clos_of", None)) else None


def _punit_name(key: Any) -> str | None:
    if key is None:
        return None
    package, punit = key
    return f"{package}/{punit}"


def _components(bln: Balloon) -> list[str]:
    return [f"{c.name}:{cpuset.format(c.cpus)}" for c in bln.components]


def _balloon_row(policy: BalloonsPolicy, bln: Balloon, pct: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": bln.name,
        "type": bln.bdef.name,
        "cpus": cpuset.format(bln.cpus),
        "cpu_class": policy.balloon_class(bln.bdef),
        "mems": cpuset.format(bln.mems),
        "shared_idle_cpus": cpuset.format(bln.shared_idle),
        "requested_mcpu": bln.requested,
    }
    if pct is not None and callable(getattr(pct, "punit_key", None)):
        punits = sorted({k for c in cpuset.ids(bln.cpus) if (k := pct.punit_key(c)) is not None})
        if punits:
            row["punit"] = [_punit_name(k) for k in punits]
    if bln.components:
        row["components"] = _components(bln)
    groups = sorted(g for g, n in bln.groups.items() if n > 0)
    if groups:
        row["groups"] = groups
    row["containers"] = sorted(m.pretty for m in bln.members.values())
    return row


def _cpu_rows(policy: BalloonsPolicy, pct: Any) -> list[dict[str, Any]]:
    topo = policy.topology
    owner: dict[int, str] = {}
    shared: dict[int, list[str]] = {}
    for top in policy.balloons:
        for bln in top.walk():
            if bln.components:
                continue
            for cpu in cpuset.ids(bln.cpus):
                owner[cpu] = bln.name
        for cpu in cpuset.ids(top.shared_idle):
            shared.setdefault(cpu, []).append(top.name)
    punit_key = getattr(pct, "punit_key", None) if pct is not None else None
    rows = []
    for cpu, info in topo.cpus.items():
        bit = 1 << cpu
        if cpu in owner:
            where = owner[cpu]
        elif not policy.allowed & bit:
            where = "not allowed"
        elif policy.reserved & bit:
            where = "reserved"
        else:
            where = "free"
        row: dict[str, Any] = {
            "cpu": cpu,
            "balloon": where,
            "class": _class_name(policy, cpu),
            "package": info.package,
            "die": info.die,
            "node": info.node,
        }
        if cpu in shared:
            row["shared_idle_of"] = shared[cpu]
        clos = pct.clos_of(cpu) if pct is not None else None
        if clos is not None:
            row["clos"] = clos
        punit = _punit_name(punit_key(cpu)) if callable(punit_key) else None
        if punit is not None:
            row["punit"] = punit
        rows.append(row)
    return rows


def _punit_rows(pct: Any) -> list[dict[str, Any]]:
    rows = []
    for pu in getattr(pct, "punits", None) or ():
        row: dict[str, Any] = {"name": _punit_name(getattr(pu, "key", None))}
        for field in ("cpus", "level", "max_hp", "guaranteed_hp", "tf_enabled"):
            if hasattr(pu, field):
                value = getattr(pu, field)
                row[field] = cpuset.format(value) if field == "cpus" else value
        rows.append(row)
    return rows


def _clos_cells(pu: Any) -> dict[str, Any]:
    cells: dict[str, Any] = {"cp_enabled": pu.cp_enabled}
    for cl in pu.clos:
        cells[f"clos{cl.clos}_mhz"] = f"{cl.min_khz // 1000}-{cl.max_khz // 1000}"
    return cells


def _add_frequencies(out: dict[str, Any], policy: BalloonsPolicy, interval: Interval) -> None:
    """The busy MHz and CLOS bounds columns of ``inspect`` (see the module doc)."""
    after = interval.after
    if after is None:
        return
    columns: list[str] = []
    if interval.seconds is not None:
        for row, bln in zip(out["balloons"], policy.balloons, strict=True):
            mhz = interval.busy_mhz(cpuset.ids(bln.cpus))
            if mhz is not None:
                row["busy_mhz"] = round(mhz)
                columns = ["busy_mhz"]
        if columns:
            out["busy_interval_seconds"] = round(interval.seconds, 3)
    if after.punits:
        rows = out.setdefault("punits", [])
        by_name = {r.get("name"): r for r in rows}
        for pu in after.punits:
            name = f"{pu.package}/{pu.punit}"
            row = by_name.get(name)
            if row is None:
                row = by_name[name] = {"name": name}
                rows.append(row)
            row.update(_clos_cells(pu))
        columns += [f"clos{cl.clos}_mhz" for cl in after.punits[0].clos]
    if columns:
        out["frequency_source"] = after.backend or "unknown"
        if after.simulated:
            out["simulated_columns"] = columns


MAP_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
"""Legend keys of the balloons on the CPU map, in :attr:`BalloonsPolicy.balloons` order."""
MAP_OTHERS = "+"
"""The key of every balloon beyond :data:`MAP_KEYS`."""
MAP_PLACES = {"reserved": "=", "free": ".", "not allowed": "#"}
"""Keys of the CPUs no balloon owns."""


def _cpu_map(policy: BalloonsPolicy, out: dict[str, Any], interval: Interval) -> cpumap.CpuMap:
    """``inspect --map``: each CPU's balloon (a key per balloon, composite
    balloons by component), its CLOS when PCT reports one, its busy MHz when
    the inspect interval has them; the punits as domains."""
    rows = {r["name"]: r for r in out["balloons"]}
    names = [b.name for top in policy.balloons for b in top.walk() if not b.components]
    owned = {r["balloon"] for r in out["cpus"]}
    keys: dict[str, str] = {}
    legend: list[cpumap.LegendEntry] = []
    others = 0
    sim = "(SIM)" if interval.after is not None and interval.after.simulated else ""
    for name in (n for n in names if n in owned):
        if len(keys) < len(MAP_KEYS):
            keys[name] = MAP_KEYS[len(keys)]
            row = rows.get(name, {})
            text = [str(row.get("type", "")), f"cpus {row.get('cpus', '')}"] if row else []
            if row.get("punit"):
                text.append("punit " + ",".join(row["punit"]))
            if row.get("busy_mhz") is not None:
                text.append(f"busy {row['busy_mhz']} MHz{sim}")
            legend.append(cpumap.LegendEntry(keys[name], name, "  ".join(text)))
        else:
            keys[name] = MAP_OTHERS
            others += 1
    if others:
        legend.append(cpumap.LegendEntry(MAP_OTHERS, f"{others} more balloon(s)"))
    for place, key in MAP_PLACES.items():
        if place in owned and place not in keys:
            keys[place] = key
            legend.append(cpumap.LegendEntry(key, place, plain=True))
    per_cpu = interval.seconds is not None
    cells = []
    punits: dict[str, list[int]] = {}
    for r in out["cpus"]:
        cpu = r["cpu"]
        mhz = interval.busy_mhz([cpu]) if per_cpu else None
        clos = r.get("clos")
        mark = str(clos) if isinstance(clos, int) and 0 <= clos <= 9 else ""
        cells.append(cpumap.Cell(cpu, keys[r["balloon"]], mark, round(mhz) if mhz else None))
        if r.get("punit"):
            punits.setdefault(r["punit"], []).append(cpu)
    return cpumap.CpuMap(
        topology=cpumap.skeleton(policy.topology),
        cells=cells,
        legend=legend,
        domains=[cpumap.Domain(f"punit {name}", cpus) for name, cpus in punits.items()],
        mark_title="CLOS" if any(c.mark for c in cells) else "",
        simulated=bool(sim),
    )


def inspect(
    policy: BalloonsPolicy | None, busy: BusyFrequency | None = None
) -> dict[str, Any] | None:
    """The JSON-able state of ``/debug/state`` (``policy`` key)."""
    if policy is None:
        return None
    if policy.config is None:
        return {"configured": False}
    pct = _pct(policy)
    out: dict[str, Any] = {
        "allowed_cpus": cpuset.format(policy.allowed),
        "free_cpus": cpuset.format(policy.free),
        "idle_cpu_class": policy.cpu_classes.idle_class,
        "balloons": [_balloon_row(policy, b, pct) for b in policy.balloons],
        "containers": {
            cid: {"balloon": bln.name, "requested_mcpu": bln.members[cid].request}
            for cid, bln in policy.owner.items()
            if cid in bln.members
        },
        "cpus": _cpu_rows(policy, pct),
    }
    wanted = (getattr(pct, "mode", "") or getattr(pct, "wanted_mode", "")) if pct else ""
    if wanted:
        out["pct_mode"] = wanted
        out["pct_degraded"] = bool(getattr(pct, "degraded", False))
    punits = _punit_rows(pct) if pct is not None else []
    if punits:
        out["punits"] = punits
    interval = busy.interval("inspect") if busy is not None else Interval()
    if busy is not None:
        _add_frequencies(out, policy, interval)
    out["cpu_map"] = msgspec.to_builtins(_cpu_map(policy, out, interval))
    return out
