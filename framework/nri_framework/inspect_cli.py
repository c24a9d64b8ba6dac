"""``nri-resource-policy inspect``: what a running plugin decided, as tables.

Reads ``/debug/state`` of the plugin's instrumentation endpoint (see
:mod:`nri_framework.instrumentation`; the plugin must run with
``--metrics-address``) and prints the plugin and its health, then every
table of the policy's state, the containers with their cpusets joined with
what the policy says of each (the balloon), and the CPUs.

The tables are data-driven: a list of dicts under the policy's state is a
table, its columns the keys of the rows. A column that no row has is not
printed, so a PCT column (``clos`` per CPU, ``punit`` per balloon) appears
exactly when the policy reports it. The columns the policy names in
``simulated_columns`` (figures a model computed, such as the SST helper's
``sim`` backend) are headed ``NAME(SIM)``, and its ``frequency_source`` line
says ``(simulated)``.

``--map`` draws the policy's CPU map instead (:mod:`nri_framework.cpumap`),
coloured on a terminal unless ``NO_COLOR`` is set; ``--watch SECONDS``
redraws it (or the tables) every SECONDS, in place on a terminal (clear and
home), one frame after another otherwise, until Ctrl-C (exit status 0). A
frame whose reading fails says why and the watch goes on.

    nri-resource-policy inspect [--address HOST:PORT] [--json] [--map] [--watch SECONDS]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import IO, Any

from nri_framework import cpumap
from nri_framework.instrumentation import DEFAULT_PORT, AddressError, parse_address

DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
#: Policy sections printed first, in this order; the rest follow by name.
SECTION_ORDER = ("balloons", "containers", "cpus", "punits")
#: The framework's container columns, before the policy's.
CONTAINER_COLUMNS = ("container", "state", "cpus", "mems")
MAX_STATE = 64 << 20
"""Bytes of ``/debug/state`` read at most (a 4096-CPU node's is a few MB)."""
CLEAR = "\x1b[H\x1b[2J"
"""Home and clear: a ``--watch`` frame on a terminal."""


def url_for(address: str, path: str = "/debug/state") -> str:
    """``http://HOST:PORT/path``; ``:PORT`` (every interface) reads from localhost."""
    host, port = parse_address(address)
    if host is None or host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


class StateError(ValueError):
    """A ``/debug/state`` answer that is not a JSON object of bounded size."""


def fetch_state(address: str, timeout: float = 5.0, limit: int = MAX_STATE) -> dict[str, Any]:
    with urllib.request.urlopen(url_for(address), timeout=timeout) as resp:
        body = resp.read(limit + 1)
    if len(body) > limit:
        raise StateError(f"/debug/state is larger than {limit} bytes")
    state = json.loads(body)
    if not isinstance(state, dict):
        raise StateError("/debug/state is not a JSON object")
    return state


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    return str(value)


def columns(rows: Sequence[Mapping[str, Any]], first: Sequence[str] = ()) -> list[str]:
    """Every key of ``rows``: ``first`` (when present), then scalars, then lists
    (long comma-joined cells read best at the end of a line)."""
    seen: dict[str, bool] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, list | tuple | dict):
                seen[key] = True
            else:
                seen.setdefault(key, False)
    head = [k for k in first if k in seen]
    rest = [k for k in seen if k not in head]
    return head + [k for k in rest if not seen[k]] + [k for k in rest if seen[k]]


def table(
    rows: Sequence[Mapping[str, Any]], cols: Sequence[str], simulated: Collection[str] = ()
) -> list[str]:
    """Aligned text lines: a header of the upper-cased column names (``(SIM)``
    after the ``simulated`` ones), then the rows."""
    cells = [[cell(row.get(c)) for c in cols] for row in rows]
    heads = [c.upper().replace("_", "-") + ("(SIM)" if c in simulated else "") for c in cols]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return [line(heads)] + [line(r) for r in cells]


def container_rows(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The framework's containers (``ns/pod/ctr`` -> cpuset, mems) with the
    policy's columns for each (``containers`` of the policy: by container id)."""
    extra = (state.get("policy") or {}).get("containers") or {}
    rows = []
    for c in state.get("containers", []):
        row: dict[str, Any] = {
            "container": f"{c.get('namespace', '')}/{c.get('pod', '')}/{c.get('name', '')}"
        }
        # the host learns states only from the events the policy subscribes to
        if c.get("state") not in (None, "", "unknown"):
            row["state"] = c["state"]
        row.update(cpus=c.get("cpus"), mems=c.get("mems"))
        if isinstance(extra, dict):
            row.update(extra.get(c.get("id"), {}))
        rows.append(row)
    rows.sort(key=lambda r: str(r["container"]))
    return rows


def render(state: Mapping[str, Any]) -> str:
    plugin = state.get("plugin", {})
    runtime = state.get("runtime", {})
    health = state.get("health", {})
    out = [
        f"plugin {plugin.get('index', '')}-{plugin.get('name', '')}: policy "
        f"{plugin.get('policy', '')}, version {plugin.get('version', '')}, "
        f"pid {plugin.get('pid', '')}, up {plugin.get('uptime_seconds', '')} s",
        f"runtime {cell(runtime.get('name'))} {cell(runtime.get('version'))}"
        + (f" (NRI {runtime['nri_version']})" if runtime.get("nri_version") else ""),
        "health: " + ("ok" if health.get("ok") else f"NOT OK: {health.get('reason', 'unknown')}"),
    ]
    policy = state.get("policy") or {}
    marked = policy.get("simulated_columns")
    simulated = {c for c in marked if isinstance(c, str)} if isinstance(marked, list) else set()
    for key, value in policy.items():
        if not isinstance(value, list | dict) and key != "error":
            sim = " (simulated)" if key == "frequency_source" and simulated else ""
            out.append(f"{key.replace('_', ' ')}: {cell(value)}{sim}")
    if policy.get("error"):
        out.append(f"policy error: {policy['error']}")
    sections = [k for k in SECTION_ORDER if k in policy or k == "containers"]
    sections += sorted(k for k in policy if k not in SECTION_ORDER)
    for key in sections:
        if key == "containers":
            rows: Sequence[Mapping[str, Any]] = container_rows(state)
            first: Sequence[str] = CONTAINER_COLUMNS
        else:
            value = policy.get(key)
            if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                continue
            rows, first = value, ("name",)
        out.append("")
        out.append(f"{key.upper().replace('_', ' ')} ({len(rows)})")
        if rows:
            out.extend(table(rows, columns(rows, first), simulated))
    return "\n".join(out) + "\n"


def read_error(address: str, exc: Exception) -> str:
    """What a failed reading of ``address`` prints."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return (
        f"nri-resource-policy inspect: cannot read {url_for(address)}: {reason} "
        "(is the plugin running with --metrics-address?)"
    )


READ_ERRORS = (urllib.error.URLError, OSError, ValueError)
"""What a reading of ``/debug/state`` may raise (JSON and size errors are ValueErrors)."""


def frame(address: str, timeout: float, draw: Callable[[dict[str, Any]], str]) -> tuple[int, str]:
    """One reading drawn: (exit status, text); a failure is its message."""
    try:
        return 0, draw(fetch_state(address, timeout))
    except cpumap.MapError as exc:
        return 1, f"nri-resource-policy inspect: {exc}\n"
    except READ_ERRORS as exc:
        return 1, read_error(address, exc) + "\n"


def watch(
    next_frame: Callable[[], str],
    every: float,
    out: IO[str],
    *,
    in_place: bool,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    frames: int | None = None,
) -> int:
    """Draw ``next_frame()`` every ``every`` seconds (on a fixed schedule from
    the first frame: a slow reading does not drift it) until Ctrl-C, or
    ``frames`` times; exit status 0."""
    start = clock()
    n = 0
    try:
        while frames is None or n < frames:
            text = next_frame()
            if in_place:
                out.write(CLEAR + text)
            else:
                out.write(("\n" if n else "") + text)
            out.flush()
            n += 1
            if frames is not None and n >= frames:
                break
            due = start + every * max(n, math.floor((clock() - start) / every) + 1)
            sleep(max(0.0, due - clock()))
    except KeyboardInterrupt:
        out.write("\n")
    return 0


def positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nri-resource-policy inspect", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"the plugin's --metrics-address (default {DEFAULT_ADDRESS}; ':PORT' = localhost)",
    )
    parser.add_argument("--json", action="store_true", help="print /debug/state as it is")
    parser.add_argument(
        "--map", action="store_true", help="draw the node's CPUs: each one's balloon, CLOS, MHz"
    )
    parser.add_argument(
        "--watch",
        type=positive_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS until Ctrl-C",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    args = parser.parse_args(argv)
    try:
        url_for(args.address)
    except AddressError as exc:
        print(f"nri-resource-policy inspect: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    draw: Callable[[dict[str, Any]], str]
    if args.json:
        draw = lambda state: json.dumps(state, indent=2) + "\n"  # noqa: E731
    elif args.map:
        colour = cpumap.use_colour(out)
        draw = lambda state: cpumap.render(cpumap.cpu_map_of(state), colour=colour)  # noqa: E731
    else:
        draw = render
    if args.watch is not None:
        return watch(
            lambda: frame(args.address, args.timeout, draw)[1],
            args.watch,
            out,
            in_place=out.isatty(),
        )
    status, text = frame(args.address, args.timeout, draw)
    (out if status == 0 else sys.stderr).write(text)
    return status
