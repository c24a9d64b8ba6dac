"""SST discovery and the goresctrl/nri-plugins sequences (sst.md §2.1, §3) over any backend.

:class:`SstPlatform` is written once for every backend. Operations that
goresctrl runs "per package" loop over every valid punit of the package; each
backend call is one ioctl. Backend ``OSError``s become
``HelperError("hardware-error")`` naming the operation, package and punit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from nri_sst import messages as m
from nri_sst.backends.base import Backend, ClosParam
from nri_sst.hostfs import Machine


@contextmanager
def hardware(what: str) -> Iterator[None]:
    """Backend ``OSError`` -> ``HelperError("hardware-error", "<what>: <strerror>")``."""
    try:
        yield
    except OSError as exc:
        raise m.HelperError("hardware-error", f"{what}: {exc.strerror or exc}") from None


@dataclass
class Punit:
    package: int
    punit: int
    cpus: list[int] = field(default_factory=list)
    core_of: dict[int, int] = field(default_factory=dict)
    """CPU -> punit core (module) id."""


class SstPlatform:
    def __init__(self, backend: Backend, machine: Machine) -> None:
        self.backend = backend
        self.machine = machine
        self.punits: dict[tuple[int, int], Punit] = {}
        self.punit_of: dict[int, tuple[int, int]] = {}
        self.api_version = 0
        self.warnings: list[str] = []
        backend.attach(machine)
        mismatches: list[int] = getattr(backend, "mismatches", [])
        if mismatches:
            self.warnings.append(
                f"{len(mismatches)} online CPUs do not match the {backend.name} model's "
                f"topology (first: cpu {mismatches[0]}); is the host root the modelled machine?"
            )
        if backend.supported:
            self._discover()

    @property
    def supported(self) -> bool:
        return self.backend.supported and bool(self.punits)

    def _discover(self) -> None:
        """goresctrl ``Init()``: packages from sysfs, valid punits, GET_PHY_ID per CPU."""
        try:
            self.api_version = self.backend.api_version()
        except OSError:
            self.api_version = 1
        for pkg in self.machine.packages:
            try:
                mask = self.backend.count_instances(pkg)
            except OSError as exc:
                self.warnings.append(f"package {pkg}: COUNT_TPMI_INSTANCES failed: {exc}")
                continue
            for pd in range(16):
                if mask >> pd & 1:
                    self.punits[(pkg, pd)] = Punit(pkg, pd)
        for cpu in sorted(self.machine.online):
            try:
                phy = self.backend.phy_id(cpu)
            except OSError as exc:
                self.warnings.append(f"cpu {cpu}: GET_PHY_ID failed: {exc}")
                continue
            pd, core = (phy >> 11) & 0x1F, (phy >> 3) & 0xFF
            pu = self.punits.get((self.machine.package_of[cpu], pd))
            if pu is None:
                self.warnings.append(f"cpu {cpu}: punit {pd} not in valid_mask, dropped")
                continue
            pu.cpus.append(cpu)
            pu.core_of[cpu] = core
            self.punit_of[cpu] = (pu.package, pu.punit)

    def require(self) -> None:
        if not self.supported:
            raise m.HelperError("not-supported", "SST not supported on this host")

    def packages(self) -> list[int]:
        return sorted({pkg for pkg, _ in self.punits})

    def package_punits(self, pkg: int) -> list[Punit]:
        return [self.punits[k] for k in sorted(self.punits) if k[0] == pkg]

    # ------------------------------------------------------------------ status

    def punit_info(self, pu: Punit) -> m.PunitInfo:
        b = self.backend
        where = f"pkg {pu.package} punit {pu.punit}"
        with hardware(f"PERF_LEVELS {where}"):
            pl = b.perf_levels(pu.package, pu.punit)
        with hardware(f"CORE_POWER_STATE {where}"):
            cp = b.core_power_get(pu.package, pu.punit)
        level = pl.current_level
        tf_supported = bool(pl.tf_support >> level & 1)
        buckets: list[m.TFBucket] = []
        lp_clip: list[int] = []
        if tf_supported:
            with hardware(f"GET_TURBO_FREQ_INFO {where}"):
                tfi = b.turbo_freq_info(pu.package, pu.punit, level)
            for i, count in enumerate(tfi.bucket_core_counts):
                if count == 0:
                    break
                freqs = [row[i] for row in tfi.trl_freq_mhz if i < len(row) and row[i]]
                buckets.append(m.TFBucket(hp_cores=count, max_mhz=freqs))
            lp_clip = [f for f in tfi.lp_clip_mhz if f]
        with hardware(f"GET_PERF_LEVEL_INFO {where}"):
            info = b.level_info(pu.package, pu.punit, level)
        counts = [bk.hp_cores for bk in buckets]
        clos = [self.clos_config(pu, c) for c in range(m.CLOS_COUNT)] if cp.supported else []
        return m.PunitInfo(
            package=pu.package,
            punit=pu.punit,
            cpus=list(pu.cpus),
            pp=m.PPInfo(
                supported=pl.enabled,
                current_level=level,
                levels=[i for i in range(8) if pl.level_mask >> i & 1],
                locked=pl.locked,
                feature_rev=pl.feature_rev,
            ),
            cp=m.CPInfo(
                supported=cp.supported,
                enabled=cp.enable,
                priority="ordered" if cp.ordered else "proportional",
            ),
            tf=m.TFInfo(
                supported=tf_supported,
                enabled=bool(pl.feature_state & 0b10),
                buckets=buckets,
                lp_clip_mhz=lp_clip,
            ),
            bf=m.BFInfo(
                supported=bool(pl.bf_support >> level & 1), enabled=bool(pl.feature_state & 1)
            ),
            base_mhz=info.base_mhz,
            max_hp_cpus=max(counts, default=0),
            guaranteed_hp_cpus=min(counts, default=0),
            clos=clos,
        )

    def clos_config(self, pu: Punit, clos: int) -> m.ClosConfig:
        with hardware(f"CLOS_PARAM get pkg {pu.package} punit {pu.punit} clos {clos}"):
            p = self.backend.clos_param_get(pu.package, pu.punit, clos)
        return m.ClosConfig(
            clos=clos,
            min_khz=p.min_mhz * 1000,
            max_khz=p.max_mhz * 1000,
            proportional_priority=p.prop_prio,
        )

    def packages_info(self) -> list[m.PackageInfo]:
        out = []
        for pkg in self.packages():
            pus = [self.punit_info(pu) for pu in self.package_punits(pkg)]
            cpus = sorted(c for pu in pus for c in pu.cpus)
            out.append(m.PackageInfo(package=pkg, cpus=cpus, punits=pus))
        return out

    def tf_status(self) -> list[m.PunitTF]:
        out = []
        for (pkg, pd), _pu in sorted(self.punits.items()):
            with hardware(f"PERF_LEVELS pkg {pkg} punit {pd}"):
                pl = self.backend.perf_levels(pkg, pd)
            out.append(
                m.PunitTF(
                    package=pkg,
                    punit=pd,
                    supported=bool(pl.tf_support >> pl.current_level & 1),
                    enabled=bool(pl.feature_state & 0b10),
                )
            )
        return out

    def clos_bounds(self) -> list[m.PunitClos]:
        """Every punit's CLOS 0..3 as the hardware holds them (empty without SST-CP)."""
        out = []
        for (pkg, pd), pu in sorted(self.punits.items()):
            with hardware(f"CORE_POWER_STATE pkg {pkg} punit {pd}"):
                cp = self.backend.core_power_get(pkg, pd)
            if not cp.supported:
                continue
            clos = [self.clos_config(pu, c) for c in range(m.CLOS_COUNT)]
            out.append(m.PunitClos(package=pkg, punit=pd, cp_enabled=cp.enable, clos=clos))
        return out

    # ------------------------------------------------------------------ §3 sequences

    def cp_reset(self, pkg: int) -> None:
        """§3.2: CLOS 0..3 = {prop 0, min 0, max 25500}; every core -> CLOS 0."""
        for pu in self.package_punits(pkg):
            for clos in range(m.CLOS_COUNT):
                with hardware(f"CPReset on package {pkg} punit {pu.punit}"):
                    self.backend.clos_param_set(pkg, pu.punit, clos, ClosParam(0, 25500, 0))
            cores = sorted(set(pu.core_of.values()))
            self._assoc(pu, [(core, 0) for core in cores], f"CPReset on package {pkg}")

    def _assoc(self, pu: Punit, assoc: list[tuple[int, int]], what: str) -> None:
        for i in range(0, len(assoc), 64):
            chunk = assoc[i : i + 64]
            with hardware(f"{what} punit {pu.punit}"):
                self.backend.clos_assoc_set(pu.package, pu.punit, chunk)

    def tf_set(self, pkg: int, enable: bool) -> None:
        """§3.4: read-modify-write of feature_state bit 1, keeping BF."""
        what = "TFEnable" if enable else "TFDisable"
        for pu in self.package_punits(pkg):
            with hardware(f"{what} on package {pkg} punit {pu.punit}"):
                pl = self.backend.perf_levels(pkg, pu.punit)
                feature = (pl.feature_state & 0b01) | (0b10 if enable else 0)
                self.backend.perf_set_feature(pkg, pu.punit, feature)

    def cp_set(self, pkg: int, enable: bool | None = None, ordered: bool | None = None) -> None:
        """§3.3: read CORE_POWER_STATE, write it back with one field changed."""
        what = "CPSetPriorityType" if enable is None else ("CPEnable" if enable else "CPDisable")
        for pu in self.package_punits(pkg):
            with hardware(f"{what} on package {pkg} punit {pu.punit}"):
                cur = self.backend.core_power_get(pkg, pu.punit)
                en = cur.enable if enable is None else enable
                od = cur.ordered if ordered is None else ordered
                self.backend.core_power_set(pkg, pu.punit, en, od)

    def in_managed_state(self) -> bool:
        """Every punit has CP enabled with ordered priority, and TF enabled
        where its current level supports it: what :meth:`prepare_managed_mode`
        leaves behind."""
        for (pkg, pd), _pu in sorted(self.punits.items()):
            with hardware(f"CORE_POWER_STATE pkg {pkg} punit {pd}"):
                cp = self.backend.core_power_get(pkg, pd)
            with hardware(f"PERF_LEVELS pkg {pkg} punit {pd}"):
                pl = self.backend.perf_levels(pkg, pd)
            tf_supported = bool(pl.tf_support >> pl.current_level & 1)
            if not (cp.enable and cp.ordered) or (tf_supported and not pl.feature_state & 0b10):
                return False
        return True

    def prepare_managed_mode(self, keep_programmed: bool = False) -> bool:
        """nri-plugins order per package: CPReset, TFEnable, CPSetPriorityType(ordered).
        With ``keep_programmed`` and SST already in managed state, nothing is
        written. True when SST was reset."""
        if keep_programmed and self.in_managed_state():
            return False
        for pkg in self.packages():
            self.cp_reset(pkg)
            self.tf_set(pkg, True)
            self.cp_set(pkg, ordered=True)
        return True

    def configure_clos(self, clos: int, min_khz: int, max_khz: int, prop: int) -> None:
        param = ClosParam(min_mhz=min_khz // 1000, max_mhz=max_khz // 1000, prop_prio=prop)
        for pkg in self.packages():
            for pu in self.package_punits(pkg):
                with hardware(f"ClosConfigure({clos}) on package {pkg} punit {pu.punit}"):
                    self.backend.clos_param_set(pkg, pu.punit, clos, param)

    def enable_cp(self) -> None:
        for pkg in self.packages():
            self.cp_set(pkg, enable=True)

    def teardown(self) -> None:
        """§3.5 Shutdown, per package: CPReset, TFDisable, CPDisable."""
        for pkg in self.packages():
            self.cp_reset(pkg)
            self.tf_set(pkg, False)
            self.cp_set(pkg, enable=False)

    def associate(self, clos: int, cpus: list[int]) -> list[int]:
        """Group CPUs by punit, one CLOS_ASSOC per <= 64 distinct cores.
        Returns every CPU now on ``clos``: CLOS is per core, so the requested
        CPUs and their sibling threads."""
        by_punit: dict[tuple[int, int], set[int]] = {}
        for cpu in cpus:
            key = self.punit_of[cpu]
            by_punit.setdefault(key, set()).add(self.punits[key].core_of[cpu])
        moved: list[int] = []
        for key in sorted(by_punit):
            pu = self.punits[key]
            cores = by_punit[key]
            self._assoc(pu, [(core, clos) for core in sorted(cores)], "ClosAssociate")
            moved += [c for c, core in pu.core_of.items() if core in cores]
        return sorted(moved)

    def get_association(self, cpus: list[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for cpu in cpus:
            pkg, pd = self.punit_of[cpu]
            core = self.punits[(pkg, pd)].core_of[cpu]
            with hardware(f"CLOS_ASSOC get cpu {cpu}"):
                out[cpu] = self.backend.clos_assoc_get(pkg, pd, core)
        return out

    def first_punit(self) -> Punit:
        self.require()
        return self.punits[min(self.punits)]
