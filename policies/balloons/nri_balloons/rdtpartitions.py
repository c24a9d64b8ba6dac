"""RDT partitions: ``control.rdt`` ``partitions``/``options``/``force`` as
resctrl control groups (upstream hands them to goresctrl's ``rdt.SetConfig``).

The plugin writes no resctrl: it reads resctrl's ``info`` through the SST
helper (:class:`~nri_sst.messages.ReadResctrl`), computes every class's
schemata as goresctrl v0.13 does (:func:`resolve`) and sends the whole
configuration at once (:class:`~nri_sst.messages.SetResctrl`), which the
helper validates again and applies.

goresctrl's model: partitions split each cache id's ways between them
(percentages: the smallest request first, each at least ``min_cbm_bits``,
the last takes what is left; or absolute bitmasks that must not overlap; not
mixed), placed from bit 0 in partition-name order; a class takes a share of
its partition's ways (a percentage from the low end, a percentage range, or a
bitmask shifted to the partition's first way); memory bandwidth of a class is
its percentage of its partition's. Each class is one control group named
exactly as the class (no prefix: containerd's goresctrl looks for the class's
group by its name, and partitions have no directory); ``system/default`` (or
``""``) is resctrl's root group. ``cacheId`` keys are ``all`` or id lists
(``0,1``, ``0-3``). Not modelled: CDP (``code``/``data``) and MBps mode are
refused by :func:`resolve` with a clear error (goresctrl handles them).
"""

from __future__ import annotations

import logging
import re

import msgspec
from nri_sst import messages as m

from nri_balloons.config import CacheIdCat, RdtClass, RdtControl, RdtOptions
from nri_balloons.sstlink import Ask, Steps, WriteRefused, WriterUnavailable

log = logging.getLogger("policy")

ROOT_CLASS = "system/default"
CACHE_ID_ALL = "all"
LEVELS = ("L2", "L3")


class RdtConfigError(ValueError):
    """An invalid ``control.rdt`` (goresctrl's messages)."""


class Pct(msgspec.Struct, frozen=True):
    pct: int


class PctRange(msgspec.Struct, frozen=True):
    low: int
    high: int


class Mask(msgspec.Struct, frozen=True):
    mask: int


Alloc = Pct | PctRange | Mask


def wanted(rdt: RdtControl) -> bool:
    """Whether the configuration programs resctrl (upstream's ``ToGoresctrl``:
    enabled, with ``options`` or ``partitions``)."""
    return rdt.enable and (rdt.options is not None or bool(rdt.partitions))


def _uint(text: str, bits: int, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise RdtConfigError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    v = int(text)
    if v >= 1 << bits:
        raise RdtConfigError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return v


def list_bitmask(text: str) -> int:
    """goresctrl's ``listStrToBitmask``: ``0-5``, ``2,3``."""
    mask = 0
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        a = _uint(lo, 6, "bitmask")
        if not sep:
            mask |= 1 << a
            continue
        b = _uint(hi, 6, "bitmask")
        if b <= a:
            raise RdtConfigError(f"invalid range {part!r} in bitmask {text!r}")
        mask |= ((1 << (b - a + 1)) - 1) << a
    return mask


def cache_ids(text: str) -> list[int]:
    """goresctrl's ``listStrToArray`` of a ``cacheId`` key: ``0``, ``0,2``, ``0-3``."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        a = _uint(lo, 7, "cache id")
        if not sep:
            out.append(a)
            continue
        b = _uint(hi, 7, "cache id")
        if b <= a:
            raise RdtConfigError(f"invalid integer range {part!r} in {text!r}")
        out.extend(range(a, b + 1))
    return sorted(out)


def parse_proportion(text: str, min_bits: int) -> Alloc | None:
    """goresctrl's ``CacheProportion.parse``: ``50%``, ``50-60%``, ``0-5``, ``0xff0``."""
    if not text:
        return None
    if text.endswith("%"):
        lo, sep, hi = text[:-1].partition("-")
        if not sep:
            pct = _uint(lo, 7, "percentage")
            if pct > 100:
                raise RdtConfigError(f"invalid percentage value {text!r}")
            return Pct(pct)
        low, high = _uint(lo, 7, "percentage"), _uint(hi, 7, "percentage")
        if low > high or low > 100 or high > 100:
            raise RdtConfigError(f"invalid percentage range {text!r}")
        return PctRange(low, high)
    if text.startswith("0x"):
        if not re.fullmatch(r"[0-9a-fA-F]{1,16}", text[2:]):
            raise RdtConfigError(f'strconv.ParseUint: parsing "{text[2:]}": invalid syntax')
        value = int(text[2:], 16)
    else:
        value = list_bitmask(text)
    ones = value.bit_count()
    if value == 0 or ones != value.bit_length() - ((value & -value).bit_length() - 1):
        raise RdtConfigError(
            f"invalid cache bitmask {text!r}: more than one continuous block of ones"
        )
    if ones < min_bits:
        raise RdtConfigError(f"invalid cache bitmask {text!r}: number of bits less than {min_bits}")
    return Mask(value)


def _contiguous(mask: int) -> bool:
    low = mask & -mask
    return mask > 0 and not (mask + low) & mask


def overlay(alloc: Alloc, base: int, min_bits: int) -> int:
    """goresctrl's ``Overlay``: ``alloc`` within the (partition's) ``base`` mask."""
    if base == 0:
        raise RdtConfigError("empty basemask not allowed")
    if not _contiguous(base):
        raise RdtConfigError(f"invalid basemask {base:#x}: more than one block of bits set")
    if base.bit_count() < min_bits:
        raise RdtConfigError(f"invalid basemask {base:#x}: fewer than {min_bits} bits set")
    lsb0 = (base & -base).bit_length() - 1
    if isinstance(alloc, Mask):
        mask = alloc.mask << lsb0
        if mask | base != base:
            raise RdtConfigError(
                f"bitmask {mask:#x} ({alloc.mask:#x} << {lsb0}) does not fit basemask {base:#x}"
            )
        return mask
    low, high = (0, alloc.pct) if isinstance(alloc, Pct) else (alloc.low, alloc.high)
    width = base.bit_length() - lsb0
    low = max(low, 1)
    if low > high or high > 100:
        raise RdtConfigError(f"invalid percentage range in {alloc}")
    lsb = (low - 1) * width // 100
    msb = (high - 1) * width // 100
    n = msb - lsb + 1
    if n < min_bits:
        gap = min_bits - n
        if gap <= lsb:
            lsb, gap = lsb - gap, 0
        else:
            gap, lsb = gap - lsb, 0
        if gap > width - msb - 1:
            raise RdtConfigError(
                f"BUG: not enough bits available for cache bitmask ({alloc} applied on "
                f"basemask {base:#x})"
            )
        msb += gap
    return ((1 << (msb - lsb + 1)) - 1) << (lsb + lsb0)


def _cat_schema(
    cfg: dict[str, CacheIdCat], res: m.ResctrlResource | None
) -> dict[int, Alloc | None] | None:
    """goresctrl's ``CatConfig.toSchema``: per cache id, its request (``all``
    first, default 100%, then the listed ids); None when not configured."""
    if not cfg:
        return None
    ids = res.cache_ids if res is not None else []
    min_bits = res.min_cbm_bits if res is not None else 0

    def one(c: CacheIdCat) -> Alloc | None:
        if c.code or c.data:
            raise RdtConfigError(
                "'code'/'data' cache allocation (CDP) is not supported by this policy"
            )
        alloc = parse_proportion(c.unified, min_bits)
        if alloc is None:
            raise RdtConfigError(f"'unified' not specified in cache schema {c.unified!r}")
        return alloc

    default = one(cfg.get(CACHE_ID_ALL, CacheIdCat(unified="100%")))
    out: dict[int, Alloc | None] = dict.fromkeys(ids, default)
    for key, val in sorted(cfg.items()):
        if key == CACHE_ID_ALL:
            continue
        keyed = cache_ids(key)
        alloc = one(val)
        for i in keyed:
            if i in out:
                out[i] = alloc
    return out


def _mb_schema(cfg: dict[str, list[str]], res: m.ResctrlResource | None) -> dict[int, int] | None:
    if not cfg:
        return None
    ids = res.cache_ids if res is not None else []

    def one(vals: list[str]) -> int:
        for v in vals:
            if v.endswith("%"):
                return _uint(v[:-1], 7, "percentage")
            if not v.endswith("MBps"):
                log.warning("unrecognized MBA allocation unit: %s", v)
        raise RdtConfigError(
            "missing '%' value from mbSchema; required because percentage-based MBA "
            "allocation is enabled in the system"
        )

    default = one(cfg.get(CACHE_ID_ALL, ["100%"]))
    out = dict.fromkeys(ids, default)
    for key, val in sorted(cfg.items()):
        if key == CACHE_ID_ALL:
            continue
        alloc = one(val)
        for i in cache_ids(key):
            if i in out:
                out[i] = alloc
    return out


def _resolve_partitions(
    lvl: str, requests: dict[str, dict[int, Alloc | None] | None], res: m.ResctrlResource
) -> dict[str, dict[int, int]]:
    """goresctrl's ``cacheResolver``: each partition's ways per cache id."""
    names = sorted(requests)
    grants: dict[str, dict[int, int]] = {n: {} for n in names}
    total_bits = (res.cbm_mask ^ (res.cbm_mask + 1)).bit_length() - 1  # lsbZero
    for cid in res.cache_ids:
        reqs = {n: (requests[n] or {}).get(cid) for n in names}
        nils = [n for n in names if reqs[n] is None]
        if nils and len(nils) != len(names):
            raise RdtConfigError(
                f'some partitions ({", ".join(nils)}) missing {lvl} "unified" allocation '
                f"request for cache id {cid}"
            )
        if nils:
            continue
        first = reqs[names[0]]
        if isinstance(first, Mask):
            used = 0
            for n in names:
                a = reqs[n]
                if not isinstance(a, Mask):
                    raise RdtConfigError(
                        f"error resolving {lvl} allocation for cache id {cid}: mixing absolute "
                        "and relative allocations between partitions not supported"
                    )
                if a.mask & used:
                    raise RdtConfigError(
                        f"overlapping {lvl} partition allocation requests for cache id {cid}"
                    )
                used |= a.mask
                grants[n][cid] = a.mask
            continue
        pcts: list[tuple[int, str]] = []
        for n in names:
            a = reqs[n]
            if isinstance(a, Mask):
                raise RdtConfigError(
                    f"error resolving {lvl} allocation for cache id {cid}: mixing relative "
                    "and absolute allocations between partitions not supported"
                )
            if isinstance(a, PctRange):
                raise RdtConfigError("percentage ranges in partition allocation not supported")
            assert isinstance(a, Pct)
            pcts.append((a.pct, n))
        pct_total = sum(p for p, _ in pcts)
        if pct_total < 100:
            log.info(
                "requested total partition allocation <100%% (%s cache id %d: %d%%)",
                lvl,
                cid,
                pct_total,
            )
        elif pct_total > 100:
            raise RdtConfigError(
                f'accumulated {lvl} "unified" partition allocation requests for cache id '
                f"{cid} exceeds 100% ({pct_total}%)"
            )
        bits_total = pct_total * total_bits // 100
        available = bits_total
        nbits: dict[str, int] = {}
        # Go's sort.Slice by request (not stable): equal requests in name order here
        for i, (pct, n) in enumerate(sorted(pcts)):
            if available < res.min_cbm_bits or bits_total == 0:
                raise RdtConfigError(
                    f"unable to resolve {lvl} allocation for cache id {cid}, not enough "
                    "exlusive bits available"
                )
            pct_available = available * pct_total // bits_total
            k = pct * available // pct_available if pct_available else available
            k = max(k, res.min_cbm_bits)
            if k > available or i == len(pcts) - 1:
                k = available
            nbits[n] = k
            available -= k
        lsb = 0
        for n in names:
            grants[n][cid] = ((1 << nbits[n]) - 1) << lsb
            lsb += nbits[n]
    return grants


def _optional(options: RdtOptions | None, lvl: str) -> bool:
    if options is None:
        return False
    o = {"L2": options.l2, "L3": options.l3, "MB": options.mb}[lvl]
    return o is not None and o.optional


def resolve(rdt: RdtControl, info: m.ReadResctrlReply) -> list[m.ResctrlGroup]:
    """``control.rdt`` -> every class's control group and schemata (goresctrl's
    ``resolve`` and ``ctrlGroup.configure``); :class:`RdtConfigError` with
    goresctrl's message for an invalid configuration."""
    res = {r.name: r for r in info.resources}
    for resource in info.resources:
        if resource.name in ("L2CODE", "L2DATA", "L3CODE", "L3DATA"):
            raise RdtConfigError(
                f"{resource.name}: CDP-enabled resctrl is not supported by this policy"
            )
    mb = res.get("MB")
    if mb is not None and mb.mbps:
        raise RdtConfigError(
            "MBps-based memory bandwidth allocation is not supported by this policy"
        )
    part_cat: dict[str, dict[str, dict[int, int]]] = {}
    part_mb: dict[str, dict[int, int]] = {}
    try:
        for lvl in LEVELS:
            r = res.get(lvl)
            reqs: dict[str, dict[int, Alloc | None] | None] = {}
            for name, p in sorted(rdt.partitions.items()):
                try:
                    reqs[name] = _cat_schema(_cat(p, lvl), r)
                except RdtConfigError as exc:
                    raise RdtConfigError(
                        f"failed to parse {lvl} allocation request for partition {name!r}: {exc}"
                    ) from None
            if r is not None and reqs:
                for name, grant in _resolve_partitions(lvl, reqs, r).items():
                    part_cat.setdefault(name, {})[lvl] = grant
        for name, p in sorted(rdt.partitions.items()):
            try:
                sch = _mb_schema(p.mb_allocation, mb)
            except RdtConfigError as exc:
                raise RdtConfigError(
                    f"failed to resolve MB allocation for partition {name!r}: {exc}"
                ) from None
            if sch is not None and mb is not None:
                part_mb[name] = {i: max(v, mb.min_bandwidth) for i, v in sch.items()}
        groups: dict[str, m.ResctrlGroup] = {}
        for pname, p in sorted(rdt.partitions.items()):
            for cname, c in sorted(p.classes.items()):
                gname = "" if cname in (ROOT_CLASS, "") else cname
                if cname != ROOT_CLASS and (
                    cname in (".", "..") or "/" in cname or "\n" in cname or len(cname) >= 4096
                ):
                    raise RdtConfigError(
                        f"unqualified class name {cname!r} (must not be '.' or '..' and must "
                        "not contain '/' or newline)"
                    )
                if gname in groups:
                    raise RdtConfigError(
                        f"class names must be unique, {cname!r} defined multiple times"
                    )
                groups[gname] = m.ResctrlGroup(
                    name=gname,
                    schemata=_class_schemata(cname, c, p, pname, res, part_cat, part_mb, rdt),
                )
    except RdtConfigError as exc:
        raise RdtConfigError(f"invalid configuration: {exc}") from None
    return [groups[n] for n in sorted(groups)]


def _cat(c: RdtClass, lvl: str) -> dict[str, CacheIdCat]:
    return c.l2_allocation if lvl == "L2" else c.l3_allocation


def _class_schemata(
    cname: str,
    c: RdtClass,
    p: RdtClass,
    pname: str,
    res: dict[str, m.ResctrlResource],
    part_cat: dict[str, dict[str, dict[int, int]]],
    part_mb: dict[str, dict[int, int]],
    rdt: RdtControl,
) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for lvl in LEVELS:
        r = res.get(lvl)
        try:
            sch = _cat_schema(_cat(c, lvl), r)
        except RdtConfigError as exc:
            raise RdtConfigError(
                f"failed to resolve {lvl} allocation for class {cname!r}: {exc}"
            ) from None
        if sch is not None and not _cat(p, lvl):
            raise RdtConfigError(
                f"{lvl} allocation missing from partition {pname!r} but class {cname!r} "
                f"specifies {lvl} schema"
            )
        if r is None:
            if sch is not None and not _optional(rdt.options, lvl):
                raise RdtConfigError(
                    f"{lvl} cache allocation for {cname!r} specified in configuration but not "
                    "supported by system"
                )
            continue
        base = part_cat.get(pname, {}).get(lvl, {})
        line: dict[int, int] = {}
        for cid in sorted(r.cache_ids):
            mask = base.get(cid, r.cbm_mask)
            a = sch.get(cid) if sch is not None else None
            line[cid] = overlay(a, mask, r.min_cbm_bits) if a is not None else mask
        out[lvl] = line
    mb = res.get("MB")
    try:
        msch = _mb_schema(c.mb_allocation, mb)
    except RdtConfigError as exc:
        raise RdtConfigError(
            f"failed to resolve MB allocation for class {cname!r}: {exc}"
        ) from None
    if msch is not None and not p.mb_allocation:
        raise RdtConfigError(
            f"MB allocation missing from partition {pname!r} but class {cname!r} "
            "specifies MB schema"
        )
    if mb is None:
        if msch is not None and not _optional(rdt.options, "MB"):
            raise RdtConfigError(
                f"memory bandwidth allocation for {cname!r} specified in configuration but not "
                "supported by system"
            )
        return out
    base_mb = part_mb.get(pname, {})
    gran = max(mb.bandwidth_gran, 1)
    mline: dict[int, int] = {}
    for cid in sorted(mb.cache_ids):
        v = (msch.get(cid, 100) if msch is not None else 100) * base_mb.get(cid, 100) // 100
        v = max(v, mb.min_bandwidth)
        mline[cid] = min(100, -(-v // gran) * gran)  # the kernel rounds up to its granularity
    out["MB"] = mline
    return out


class RdtPartitions:
    """The resctrl configuration the policy wants and whether the helper has it."""

    def __init__(self) -> None:
        self.rdt: RdtControl | None = None
        self.pending = False
        self.info: m.ReadResctrlReply | None = None

    def decide(self, rdt: RdtControl) -> None:
        if rdt != self.rdt:
            self.rdt = rdt
            self.pending = wanted(rdt)

    def unsettled(self) -> bool:
        return self.pending

    def check_steps(self, rdt: RdtControl, timeout: float | None = None) -> Steps[str | None]:
        """Read resctrl's ``info`` and resolve ``rdt`` against it: goresctrl's
        error (None: valid, or the helper away: checked when committed)."""
        if not wanted(rdt):
            return None
        try:
            info = yield Ask(m.ReadResctrl(), timeout)
        except (WriterUnavailable, WriteRefused):
            return None
        if not isinstance(info, m.ReadResctrlReply):
            return None
        self.info = info
        if not info.mounted:
            return None
        try:
            resolve(rdt, info)
        except RdtConfigError as exc:
            return f"failed to configure goresctrl/rdt: {exc}"
        return None

    def commit_steps(self, timeout: float | None = None) -> Steps[bool]:
        """Send the whole configuration (resctrl's ``info`` read first);
        False when the helper is unavailable (it stays pending)."""
        rdt = self.rdt
        if not self.pending or rdt is None:
            return True
        try:
            info = yield Ask(m.ReadResctrl(), timeout)
            if not isinstance(info, m.ReadResctrlReply):
                return False
            self.info = info
            if not info.mounted:
                log.error("failed to initialize goresctrl/rdt: resctrl is not mounted")
                self.pending = False
                return True
            log.info("goresctrl/rdt initialized")
            try:
                groups = resolve(rdt, info)
            except RdtConfigError as exc:
                log.error("failed to configure goresctrl/rdt: %s", exc)
                self.pending = False
                return True
            reply = yield Ask(m.SetResctrl(groups=groups, force=rdt.force), timeout)
        except WriterUnavailable:
            return False
        except WriteRefused as exc:
            log.error("failed to configure goresctrl/rdt: resctrl configuration failed: %s", exc)
            self.pending = False
            return True
        self.pending = False
        if isinstance(reply, m.SetResctrlReply):
            log.info("goresctrl/rdt configuration updated")
        return True
