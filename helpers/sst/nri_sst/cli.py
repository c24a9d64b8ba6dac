"""``nri-sst-helper``: ``serve`` (the sidecar) and ``info`` (an ``sst info``-style table).

``info`` either asks a running helper (``--socket``) or reads the host itself
with a backend (read-only). The SST-PP block lists one row per punit
``pkg punit cpus`` and is followed directly by SST-BF, so the spec's
``awk '/SST-PP/,/SST-BF/' | grep -E '^\\s+[0-9]'`` prints exactly the punit rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from nri_sst import _cpuset
from nri_sst import messages as m
from nri_sst.backends import BACKENDS, SimConfig, make_backend


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nri-sst-helper", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the helper protocol on a ZeroMQ ROUTER socket")
    s.add_argument(  # after "serve" as well (SUPPRESS: keeps a -v given before it)
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    s.add_argument(
        "--socket",
        required=True,
        help="ipc:// endpoint with an absolute path, e.g. ipc:///run/nri-sst/helper.sock",
    )
    s.add_argument(
        "--retry-interval",
        default="0.5:10",
        metavar="INITIAL[:MAX]",
        help="seconds between looks for a missing socket directory or host sysfs, doubling "
        "from INITIAL up to MAX (default 0.5:10)",
    )
    i = sub.add_parser("info", help="print packages, punits and SST status")
    for q in (s, i):
        q.add_argument("--backend", choices=BACKENDS, default="auto")
        q.add_argument("--host-root", type=Path, default=Path("/"), help="host filesystem root")
        q.add_argument("--sim-state", type=Path, help="sim backend state file (JSON)")
        q.add_argument(
            "--sim-config",
            type=Path,
            help="sim backend model (JSON object of SimConfig fields; default: the Xeon 6776P)",
        )
    i.add_argument("--socket", help="ask a running helper instead of reading the host")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    log = logging.getLogger("nri_sst")
    if args.command == "serve":
        from nri_sst.retry import Backoff
        from nri_sst.server import ServeError, ipc_path, serve, wait_for_pod

        try:
            ipc_path(args.socket)
            backoff = Backoff.parse(args.retry_interval)
        except (ServeError, ValueError) as exc:
            parser.error(str(exc))
        # before the backend probes the host: a sysfs mounted late is seen
        if not wait_for_pod(ipc_path(args.socket), args.host_root, backoff):
            return 0
        backend, note = make_backend(
            args.backend, args.host_root, args.sim_state, sim_config(args.sim_config)
        )
        if note:
            log.warning("nri-sst-helper: %s", note)
        return serve(args.socket, backend, args.host_root)
    return info(args)


def sim_config(path: Path | None) -> SimConfig | None:
    """The sim model of ``--sim-config`` (unknown fields are an error)."""
    if path is None:
        return None
    try:
        raw = msgspec.json.decode(path.read_bytes(), type=dict[str, object])
        unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(SimConfig)})
        if unknown:
            raise msgspec.ValidationError(f"unknown field(s) {', '.join(unknown)}")
        return msgspec.convert(raw, type=SimConfig, strict=True)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SystemExit(f"nri-sst-helper: --sim-config {path}: {exc}") from None


def info(args: argparse.Namespace) -> int:
    if args.socket:
        from nri_sst.client import HelperUnavailable, SyncHelperClient

        try:
            with SyncHelperClient(args.socket, timeout=2.0) as c:
                reply = c.call(m.Discover(), m.DiscoverReply)
        except HelperUnavailable as exc:
            print(f"nri-sst-helper: {exc}", file=sys.stderr)
            return 1
    else:
        from nri_sst.handler import RequestHandler

        backend, note = make_backend(
            args.backend, args.host_root, args.sim_state, sim_config(args.sim_config)
        )
        if note:
            print(f"# {note}", file=sys.stderr)
        reply = RequestHandler(backend, args.host_root).discover()
    sys.stdout.write(format_info(reply))
    return 0


def _name(pu: m.PunitInfo) -> str:
    return f"pkg{pu.package}/pd{pu.punit}".ljust(9)


def _onoff(supported: bool, enabled: bool) -> str:
    return "unsupported" if not supported else ("enabled" if enabled else "disabled")


def format_info(d: m.DiscoverReply) -> str:
    out = [f"backend: {d.backend}  api: {d.api_version}  online: {_cpuset.format(d.online_cpus)}"]
    if not d.supported:
        out.append("SST not supported")
        return "\n".join(out) + "\n"
    pus = [pu for pkg in d.packages for pu in pkg.punits]
    out.append("SST-PP")
    out.append("  pkg  punit  cpus")
    out += [f"  {pu.package:<4} {pu.punit:<6} {_cpuset.format(pu.cpus)}" for pu in pus]
    out.append("SST-BF")
    out.append("  pkg/punit  status")
    out += [f"  {_name(pu)}  {_onoff(pu.bf.supported, pu.bf.enabled)}" for pu in pus]
    out.append("SST-PP levels")
    out.append("  pkg/punit  level  levels  locked  base(MHz)")
    out += [
        f"  {_name(pu)}  {pu.pp.current_level:<5}  "
        f"{','.join(map(str, pu.pp.levels)):<6}  {'yes' if pu.pp.locked else 'no':<6}  "
        f"{pu.base_mhz}"
        for pu in pus
    ]
    out.append("SST-CP")
    out.append("  pkg/punit  status       priority      clos(min-max MHz)")
    for pu in pus:
        clos = " ".join(f"{c.clos}:{c.min_khz // 1000}-{c.max_khz // 1000}" for c in pu.clos)
        out.append(
            f"  {_name(pu)}  {_onoff(pu.cp.supported, pu.cp.enabled):<11}  "
            f"{pu.cp.priority:<12}  {clos}"
        )
    out.append("SST-TF")
    out.append("  pkg/punit  status       buckets(hp-cores@MHz)  lp-clip(MHz)  max/guaranteed-hp")
    for pu in pus:
        buckets = ",".join(
            f"{b.hp_cores}@{b.max_mhz[0] if b.max_mhz else 0}" for b in pu.tf.buckets
        )
        clip = ",".join(map(str, pu.tf.lp_clip_mhz))
        out.append(
            f"  {_name(pu)}  {_onoff(pu.tf.supported, pu.tf.enabled):<11}  "
            f"{buckets:<21}  {clip:<12}  {pu.max_hp_cpus}/{pu.guaranteed_hp_cpus}"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
