"""The CPU map: a picture of the node in the terminal (``inspect --map``).

The shape is the framework's, the content the policy's. A policy that wants a
map returns, under the key ``cpu_map`` of its
:func:`~nri_framework.hookspecs.policy_inspect` dict, a :class:`CpuMap` (as
builtins, ``msgspec.to_builtins``):

* ``topology``: the node's skeleton, :func:`skeleton` of the
  :class:`~nri_framework.topology.Topology` the policy placed on: packages,
  dies, NUMA nodes, cores, each core its threads' CPU ids;
* ``cells``: what each CPU shows: a one-character legend ``key``, an optional
  one-character ``mark`` (what ``mark_title`` says it is, such as a CLOS) and
  an optional measured busy ``mhz``;
* ``legend``: one entry per key: its name and a line of text; the renderer
  gives each entry a colour in legend order (``plain`` ones none);
* ``domains``: named CPU groups shown in the title of each NUMA node they
  touch (such as SST punits);
* ``simulated``: the MHz are a model's, not hardware's (headed ``(SIM)``).

:func:`render` draws it without knowing what a key means: per package, per
NUMA node (and die when a package has several), one row per thread index
whose cells are the cores in order (``key`` + ``mark``), and below it a row of
busy MHz in hundreds when the policy knows them, then the legend. Cells are 3
columns wide, so 35 cores fit a 120-column line (the Xeon 6776P's 32 cores
per node fit one); wider nodes wrap. Every line is cut to ``width``. Text
from the state (names, keys) is printed with its control characters
replaced, so a state cannot move the cursor or recolour the terminal; colour
(ANSI SGR) only when asked (:func:`use_colour`: a terminal, no ``NO_COLOR``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Annotated, Any

import msgspec

from nri_framework import cpuset
from nri_framework.topology import Topology

WIDTH = 120
"""Columns of the map (every line is cut to it)."""
LABEL = 12
"""Columns of a row's label (its CPUs, or ``thread N`` when they do not fit)."""
INDENT = 4
CELL = 3
"""Columns per core: two characters and a space."""
MHZ_LABEL = "MHz/100"
RESET = "\x1b[0m"
#: (background, foreground) SGR pairs, given to legend entries in order.
PALETTE = (
    ("41", "97"),
    ("42", "30"),
    ("43", "30"),
    ("44", "97"),
    ("45", "97"),
    ("46", "30"),
    ("101", "30"),
    ("102", "30"),
    ("103", "30"),
    ("104", "30"),
    ("105", "30"),
    ("106", "30"),
)

OneChar = Annotated[str, msgspec.Meta(min_length=1, max_length=1)]
MaybeChar = Annotated[str, msgspec.Meta(max_length=1)]
CpuId = Annotated[int, msgspec.Meta(ge=0)]


class MapError(ValueError):
    """A state without a map, or with one that cannot be drawn."""


class NumaNode(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: int
    cores: list[list[CpuId]]
    """Each core: its threads' CPU ids, lowest first."""


class Die(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: int
    nodes: list[NumaNode]


class Package(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: int
    dies: list[Die]


class Skeleton(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    packages: list[Package]


class Cell(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cpu: CpuId
    key: OneChar
    mark: MaybeChar = ""
    mhz: Annotated[float, msgspec.Meta(ge=0)] | None = None


class LegendEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: OneChar
    name: str
    text: str = ""
    plain: bool = False
    """No colour (free or reserved CPUs, say)."""


class Domain(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    cpus: list[CpuId]


class CpuMap(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    topology: Skeleton
    cells: list[Cell]
    legend: list[LegendEntry]
    domains: list[Domain] = []
    mark_title: str = ""
    simulated: bool = False


def skeleton(topology: Topology) -> Skeleton:
    """The packages, dies, NUMA nodes and cores of ``topology`` (online CPUs)."""
    packages = []
    for pkg in topology.package_masks:
        dies = []
        for (dpkg, die), die_cpus in topology.die_masks.items():
            if dpkg != pkg:
                continue
            nodes = []
            for node, node_cpus in topology.node_masks.items():
                rest = node_cpus & die_cpus
                cores = []
                while rest:
                    first = (rest & -rest).bit_length() - 1
                    core = topology.core_masks[topology.cpus[first].core] & node_cpus & die_cpus
                    cores.append(cpuset.ids(core))
                    rest &= ~core
                if cores:
                    nodes.append(NumaNode(node, cores))
            dies.append(Die(die, nodes))
        packages.append(Package(pkg, dies))
    return Skeleton(packages)


def use_colour(stream: IO[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Colour for a terminal, unless ``NO_COLOR`` is set (https://no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty()) and not environ.get("NO_COLOR")


def printable(text: str) -> str:
    """``text`` with every control character (ESC among them) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text)


def cpu_map_of(state: Mapping[str, Any]) -> CpuMap:
    """The policy's map in a ``/debug/state`` document; :class:`MapError` when
    it has none or it is malformed, or lists a CPU twice."""
    policy = state.get("policy")
    raw = policy.get("cpu_map") if isinstance(policy, Mapping) else None
    if raw is None:
        name = (state.get("plugin") or {}).get("policy") or "the policy"
        raise MapError(f"no CPU map: {printable(str(name))} reports none in /debug/state")
    try:
        cmap = msgspec.convert(raw, CpuMap)
    except msgspec.ValidationError as exc:
        raise MapError(f"malformed cpu_map in /debug/state: {printable(str(exc))}") from None
    seen: set[int] = set()
    for pkg in cmap.topology.packages:
        for die in pkg.dies:
            for node in die.nodes:
                for core in node.cores:
                    for cpu in core:
                        if cpu in seen:
                            raise MapError(f"malformed cpu_map: the topology lists CPU {cpu} twice")
                        seen.add(cpu)
    return cmap


class _Painter:
    """Cells and legend keys, coloured by legend entry when asked."""

    def __init__(self, legend: Sequence[LegendEntry], colour: bool) -> None:
        self.sgr: dict[str, tuple[str, str]] = {}
        if colour:
            n = 0
            for entry in legend:
                if entry.plain or entry.key in self.sgr:
                    continue
                self.sgr[entry.key] = PALETTE[n % len(PALETTE)]
                n += 1

    def cell(self, key: str, text: str) -> str:
        sgr = self.sgr.get(key)
        return f"\x1b[{sgr[0]};{sgr[1]}m{text}{RESET}" if sgr else text

    def mhz(self, key: str, text: str) -> str:
        sgr = self.sgr.get(key)
        if not sgr or not text.strip():
            return text
        fg = str(int(sgr[0]) - 10)  # the background's colour as foreground
        return f"\x1b[{fg}m{text}{RESET}"


def _visible_cut(line: str, width: int) -> str:
    """``line`` cut to ``width`` visible columns, SGR sequences kept whole."""
    out, shown, i = [], 0, 0
    while i < len(line):
        if line[i] == "\x1b":
            end = line.index("m", i) + 1
            out.append(line[i:end])
            i = end
            continue
        if shown == width:
            text = "".join(out)
            return text + RESET if "\x1b" in text else text
        out.append(line[i])
        shown += 1
        i += 1
    return line


def _label(cpus: Iterable[int], fallback: str) -> str:
    text = cpuset.format(cpuset.from_ids(cpus))
    return text if len(text) <= LABEL else fallback


def _node_rows(
    cores: Sequence[Sequence[int]],
    cells: Mapping[int, Cell],
    paint: _Painter,
    simulated: bool,
    per_row: int,
) -> list[str]:
    rows = []
    mhz_label = (MHZ_LABEL + ("(SIM)" if simulated else ""))[:LABEL]
    for start in range(0, len(cores), per_row):
        chunk = cores[start : start + per_row]
        threads = max(len(c) for c in chunk)
        for t in range(threads):
            row_cpus = [c[t] if t < len(c) else None for c in chunk]
            label = _label((c for c in row_cpus if c is not None), f"thread {t}")
            parts, mhz_parts, any_mhz = [], [], False
            for cpu in row_cpus:
                cell = cells.get(cpu) if cpu is not None else None
                if cpu is None:
                    parts.append("  ")
                    mhz_parts.append("  ")
                    continue
                if cell is None:
                    parts.append("? ")
                    mhz_parts.append("  ")
                    continue
                key, mark = printable(cell.key), printable(cell.mark) or " "
                parts.append(paint.cell(cell.key, key + mark))
                if cell.mhz is None:
                    mhz_parts.append("  ")
                else:
                    any_mhz = True
                    mhz_parts.append(paint.mhz(cell.key, f"{min(99, round(cell.mhz / 100)):>2}"))
            rows.append((" " * INDENT + label.ljust(LABEL) + " " + " ".join(parts)).rstrip())
            if any_mhz:
                line = " " * INDENT + mhz_label.ljust(LABEL) + " " + " ".join(mhz_parts)
                rows.append(line.rstrip())
    return rows


def render(cmap: CpuMap, *, colour: bool = False, width: int = WIDTH) -> str:
    """The map as text lines of at most ``width`` columns (see the module doc)."""
    cells = {c.cpu: c for c in cmap.cells}
    paint = _Painter(cmap.legend, colour)
    per_row = max(1, (width - INDENT - LABEL - 1 + 1) // CELL)
    domains = [(printable(d.name), set(d.cpus)) for d in cmap.domains]
    packages = cmap.topology.packages
    ncpus = sum(len(c) for p in packages for d in p.dies for n in d.nodes for c in n.cores)
    nnodes = len({n.id for p in packages for d in p.dies for n in d.nodes})
    mark = printable(cmap.mark_title)
    out = [
        f"CPU MAP: {ncpus} CPUs, {len(packages)} package(s), {nnodes} NUMA node(s); "
        f"a cell is a CPU: legend key{f' and {mark}' if mark else ''}"
    ]
    for pkg in packages:
        out.append("")
        out.append(f"package {pkg.id}")
        for die in pkg.dies:
            for node in die.nodes:
                node_cpus = {cpu for core in node.cores for cpu in core}
                title = f"  node {node.id}" + (f", die {die.id}" if len(pkg.dies) > 1 else "")
                names = [name for name, cpus in domains if cpus & node_cpus]
                if names:
                    title += ": " + ", ".join(names)
                out.append(f"{title} ({len(node.cores)} cores)")
                out.extend(_node_rows(node.cores, cells, paint, cmap.simulated, per_row))
    if any(c.mhz is not None for c in cmap.cells):
        sim = " (simulated)" if cmap.simulated else ""
        out.append("")
        out.append(f"{MHZ_LABEL}: each CPU's busy MHz in hundreds since the previous reading{sim}")
    out.append("")
    out.append("legend")
    name_width = min(24, max((len(e.name) for e in cmap.legend), default=0))
    for entry in cmap.legend:
        key = paint.cell(entry.key, printable(entry.key) + " ")
        line = f"  {key} {printable(entry.name).ljust(name_width)}  {printable(entry.text)}"
        out.append(line.rstrip())
    return "\n".join(_visible_cut(line, width) for line in out) + "\n"
