"""Every request field checked against the discovered machine (sst.md §1.7).

The kernel does not check CLOS ids, unmasked MHz fields, punit core ids or
levels, and reports every TPMI failure as ``ENOTTY``; so the helper checks
everything itself, before any write. Each function raises
``HelperError("invalid-argument", ...)`` naming the field and the value, and
never anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nri_sst import messages as m
from nri_sst._cpuset import format as format_cpus
from nri_sst.hostfs import CpufreqNow, Machine
from nri_sst.resctrl import GROUP_NAME, RESERVED_NAMES

MAX_CLOS_KHZ = m.CLOS_NO_LIMIT_KHZ
MAX_PROP_PRIO = 15


def _bad(message: str) -> m.HelperError:
    return m.HelperError("invalid-argument", message)


def _int(name: str, value: object) -> int:
    if type(value) is not int:
        raise _bad(f"{name}: expected an integer, got {value!r}")
    return value


def cpus(machine: Machine, values: Iterable[object], field: str = "cpus") -> list[int]:
    """CPUs must be ints in the discovered online set; returns them sorted, unique."""
    out: set[int] = set()
    bad: list[int] = []
    for v in values:
        cpu = _int(field, v)
        if cpu not in machine.online:
            bad.append(cpu)
        out.add(cpu)
    if bad:
        named = format_cpus(b for b in bad if b >= 0) or sorted(set(bad))
        raise _bad(f"{field}: CPUs {named} are not online (online: {format_cpus(machine.online)})")
    if not out:
        raise _bad(f"{field}: empty CPU list")
    return sorted(out)


def sst_cpus(machine: Machine, punit_of: dict[int, tuple[int, int]], values: list[int]) -> None:
    """CPUs must map to a discovered punit (GET_PHY_ID succeeded, punit valid)."""
    missing = [c for c in values if c not in punit_of]
    if missing:
        raise _bad(f"cpus: CPUs {format_cpus(missing)} are not in any SST power domain")


def clos(value: object) -> int:
    c = _int("clos", value)
    if not 0 <= c < m.CLOS_COUNT:
        raise _bad(f"clos: invalid CLOS id {c} (valid: 0-{m.CLOS_COUNT - 1})")
    return c


def clos_freqs(machine: Machine, min_khz: object, max_khz: object, prop: object) -> None:
    """CLOS min/max: 0, or within cpuinfo min..max, or max = 25500 MHz ("no limit");
    multiples of 100 MHz; min <= max; proportional priority 0..15."""
    lo = _int("min_khz", min_khz)
    hi = _int("max_khz", max_khz)
    p = _int("proportional_priority", prop)
    fmin, fmax = _freq_range(machine)
    for name, v in (("min_khz", lo), ("max_khz", hi)):
        if v % 100_000:
            raise _bad(f"{name}: {v} kHz is not a multiple of 100 MHz")
        if v == 0 or (name == "max_khz" and v == MAX_CLOS_KHZ):
            continue
        if not fmin <= v <= fmax:
            raise _bad(f"{name}: {v} kHz outside {fmin}..{fmax} kHz")
    if lo > hi:
        raise _bad(f"min freq {lo // 1000} MHz must be smaller than max freq {hi // 1000} MHz")
    if not 0 <= p <= MAX_PROP_PRIO:
        raise _bad(f"proportional_priority: {p} outside 0..{MAX_PROP_PRIO}")


def _freq_range(machine: Machine, cpus_: Iterable[int] | None = None) -> tuple[int, int]:
    infos = [machine.cpufreq[c] for c in (cpus_ or machine.cpufreq) if c in machine.cpufreq]
    if not infos:
        raise m.HelperError("not-supported", "no cpufreq on this host")
    return max(i.min_khz for i in infos), min(i.max_khz for i in infos)


def cpufreq(machine: Machine, req: m.SetCpufreq, now: Callable[[int], CpufreqNow]) -> list[int]:
    """The request and the state it leaves: ``now(cpu)`` reads what sysfs has, so a
    knob the request leaves alone is checked too (min <= max after the writes;
    no non-performance EPP under the performance governor, set earlier or now)."""
    targets = cpus(machine, req.cpus)
    no_freq = [c for c in targets if c not in machine.cpufreq]
    if no_freq:
        raise m.HelperError("not-supported", f"cpus: CPUs {format_cpus(no_freq)} have no cpufreq")
    fmin, fmax = _freq_range(machine, targets)
    for name, v in (("min_khz", req.min_khz), ("max_khz", req.max_khz)):
        if v is not None and not fmin <= _int(name, v) <= fmax:
            raise _bad(f"{name}: {v} kHz outside {fmin}..{fmax} kHz")
    if req.min_khz is not None and req.max_khz is not None and req.min_khz > req.max_khz:
        raise _bad(f"min_khz {req.min_khz} is greater than max_khz {req.max_khz}")
    for c in targets:
        info = machine.cpufreq[c]
        if req.governor is not None and req.governor not in info.governors:
            raise _bad(
                f"governor: {req.governor!r} not in scaling_available_governors "
                f"{list(info.governors)} of cpu {c}"
            )
        if req.epp is not None and not _epp_ok(req.epp, info.epp_preferences):
            raise _bad(
                f"epp: {req.epp!r} is neither one of {list(info.epp_preferences)} "
                f"nor an integer 0..255 (cpu {c})"
            )
    performance_epp = req.epp is None or req.epp in ("performance", "0")
    if not performance_epp and req.governor == "performance":
        raise _bad(f"epp: {req.epp!r} is refused under the performance governor (EBUSY)")
    one_limit = (req.min_khz is None) != (req.max_khz is None)
    if one_limit or (not performance_epp and req.governor is None):
        for c in targets:
            state = now(c)
            if req.max_khz is None and req.min_khz is not None and req.min_khz > state.max_khz >= 0:
                raise _bad(
                    f"min_khz {req.min_khz} is greater than max_khz {state.max_khz} "
                    f"(scaling_max_freq of cpu {c})"
                )
            if req.min_khz is None and req.max_khz is not None and req.max_khz < state.min_khz:
                raise _bad(
                    f"max_khz {req.max_khz} is smaller than min_khz {state.min_khz} "
                    f"(scaling_min_freq of cpu {c})"
                )
            if not performance_epp and req.governor is None and state.governor == "performance":
                raise _bad(
                    f"epp: {req.epp!r} is refused under the performance governor of cpu {c} (EBUSY)"
                )
    return targets


def _epp_ok(value: str, prefs: tuple[str, ...]) -> bool:
    if value in prefs:
        return True
    return value.isascii() and value.isdigit() and len(value) <= 3 and 0 <= int(value) <= 255


def cstates(machine: Machine, req: m.SetCstates) -> tuple[list[int], frozenset[str]]:
    """Names only from the discovered list of *each* CPU (never used to build a path)."""
    targets = cpus(machine, req.cpus)
    names = frozenset(req.disabled)
    for c in targets:
        known = machine.cstates.get(c)
        if not known:
            raise m.HelperError("not-supported", f"cpu {c} has no cpuidle states")
        unknown = sorted(n for n in names if n not in known)
        if unknown:
            raise _bad(f"disabled: unknown C-states {unknown} on cpu {c} (known: {list(known)})")
    return targets, names


def uncore(machine: Machine, req: m.SetUncore, now: Callable[[int, int], tuple[int, int]]) -> None:
    """The request and the limits it leaves (``now(package, die)`` reads sysfs)."""
    key = (_int("package", req.package), _int("die", req.die))
    dom = machine.uncore.get(key)
    if dom is None:
        if not machine.uncore:
            raise m.HelperError("not-supported", "uncore driver not available")
        raise _bad(f"package/die: no uncore domain package_{key[0]:02d}_die_{key[1]:02d}")
    lo, hi = dom.initial_min_khz, dom.initial_max_khz
    for name, v in (("min_khz", req.min_khz), ("max_khz", req.max_khz)):
        if v is not None and not lo <= _int(name, v) <= hi:
            raise _bad(f"{name}: {v} kHz outside {lo}..{hi} kHz")
    if req.min_khz is not None and req.max_khz is not None and req.min_khz > req.max_khz:
        raise _bad(f"min_khz {req.min_khz} is greater than max_khz {req.max_khz}")
    if (req.min_khz is None) == (req.max_khz is None):
        return
    cur_min, cur_max = now(*key)
    if req.min_khz is not None and 0 <= cur_max < req.min_khz:
        raise _bad(f"min_khz {req.min_khz} is greater than max_khz {cur_max} (max_freq_khz now)")
    if req.max_khz is not None and req.max_khz < cur_min:
        raise _bad(f"max_khz {req.max_khz} is smaller than min_khz {cur_min} (min_freq_khz now)")


def irq_affinity(
    machine: Machine, known: dict[int, m.Interrupt], req: m.SetIrqAffinity
) -> list[tuple[int, list[int]]]:
    """The whole batch before any write: at most ``MAX_IRQ_BATCH`` IRQs, each
    named once, listed by the kernel and controllable (writable, not per-CPU),
    each CPU set non-empty and online. ``(irq, cpus)`` in IRQ order."""
    count = sum(len(g.irqs) for g in req.groups)
    if count > m.MAX_IRQ_BATCH:
        raise _bad(f"groups: {count} IRQs exceed the limit of {m.MAX_IRQ_BATCH} per request")
    out: dict[int, list[int]] = {}
    for group in req.groups:
        cpus_ = cpus(machine, group.cpus)
        for v in group.irqs:
            irq = _int("irqs", v)
            if irq in out:
                raise _bad(f"irqs: irq {irq} named more than once")
            info = known.get(irq)
            if info is None:
                raise _bad(f"irqs: no irq {irq} in /proc/interrupts")
            if not info.writable:
                raise _bad(
                    f"irqs: irq {irq} ({info.description}) is not controllable "
                    "(per-CPU, kernel-managed or read-only affinity)"
                )
            out[irq] = cpus_
    return sorted(out.items())


def hello(req: m.Hello) -> None:
    from nri_sst import PROTOCOL_VERSION

    if req.protocol != PROTOCOL_VERSION:
        raise m.HelperError(
            "protocol-mismatch",
            f"protocol {req.protocol} not supported (helper speaks {PROTOCOL_VERSION})",
        )


def resctrl(now: m.ReadResctrlReply, req: m.SetResctrl) -> None:
    """A whole resctrl configuration against resctrl's ``info``: resctrl
    mounted; group names unique, from :data:`~nri_sst.resctrl.GROUP_NAME`
    (the root is ``""``), not resctrl's own files, fewer than every
    resource's ``num_closids`` (the root holds CLOS 0); per schemata line a
    resource that exists, cache ids that exist; a cache bitmask non-empty,
    contiguous, within ``cbm_mask``, of at least ``min_cbm_bits`` bits; a
    bandwidth percentage within ``min_bandwidth``..100 and a multiple of
    ``bandwidth_gran`` (MBps: 1..2^32-1)."""
    if not now.mounted:
        raise m.HelperError("not-supported", "resctrl is not mounted (no RDT allocation)")
    resources = {r.name: r for r in now.resources}
    names = [g.name for g in req.groups]
    if len(names) > m.MAX_RESCTRL_GROUPS:
        raise _bad(f"groups: {len(names)} groups exceed the limit of {m.MAX_RESCTRL_GROUPS}")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise _bad(f"groups: resctrl group {dup[0]!r} named more than once")
    for name in names:
        if name and (not GROUP_NAME.match(name) or name in RESERVED_NAMES):
            raise _bad(
                f"groups: invalid resctrl group name {name[:80]!r} (letters, digits, "
                f"'_', '.', '-'; at most {m.MAX_RESCTRL_NAME} characters)"
            )
    groups = sum(1 for n in names if n)
    closids = min((r.num_closids for r in now.resources), default=0)
    if resources and groups > closids - 1:
        raise _bad(f"groups: {groups} resctrl groups exceed the {closids - 1} free CLOSIDs")
    for g in req.groups:
        where = f"resctrl group {g.name or '(root)'!r}"
        for rname, values in g.schemata.items():
            res = resources.get(rname)
            if res is None:
                raise _bad(f"{where}: unknown resource {rname[:80]!r} (known: {sorted(resources)})")
            for cache_id, value in values.items():
                if cache_id not in res.cache_ids:
                    raise _bad(f"{where}: {rname} has no cache id {cache_id} ({res.cache_ids})")
                _resctrl_value(where, res, cache_id, value)


def _resctrl_value(where: str, res: m.ResctrlResource, cache_id: int, value: int) -> None:
    at = f"{where}: {res.name} cache id {cache_id}"
    if res.cbm_mask:
        if value <= 0 or value & ~res.cbm_mask:
            raise _bad(f"{at}: bitmask {value:#x} not within cbm_mask {res.cbm_mask:#x}")
        low = value & -value
        if (value + low) & value:
            raise _bad(f"{at}: bitmask {value:#x} is not one contiguous block of bits")
        if value.bit_count() < res.min_cbm_bits:
            raise _bad(f"{at}: bitmask {value:#x} has fewer than {res.min_cbm_bits} bits")
    elif res.mbps:
        if not 1 <= value <= 0xFFFFFFFF:
            raise _bad(f"{at}: {value} MBps outside 1..4294967295")
    else:
        gran = max(res.bandwidth_gran, 1)
        if not res.min_bandwidth <= value <= 100 or value % gran:
            raise _bad(
                f"{at}: bandwidth {value}% outside {res.min_bandwidth}..100 or not a "
                f"multiple of {gran}"
            )
