"""``nri-resource-policy``: run, simulate, demo, list policies."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from nri_framework import __version__, logsetup
from nri_framework.host import PolicyHost
from nri_framework.registry import PolicyNotFound, list_policies, load_policy
from nri_framework.stub import DEFAULT_SOCKET, PluginStub, StubOptions

log = logging.getLogger("nri_framework.cli")


def add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run a policy as an NRI plugin")
    p.add_argument("--policy", required=True, help="policy name (entry point)")
    p.add_argument(
        "--nri-socket", default=DEFAULT_SOCKET, help="runtime NRI socket (external mode)"
    )
    p.add_argument("--nri-plugin-name", default="resource-policy")
    p.add_argument("--nri-plugin-index", default="90", help="two digits")
    p.add_argument("--state-dir", default="/var/lib/nri-resource-policy")
    p.add_argument("--host-root", default="/", help="where the host's /sys is mounted")
    p.add_argument(
        "--exit-on-disconnect",
        action="store_true",
        help="exit non-zero when the runtime connection is lost instead of reconnecting",
    )
    p.add_argument("--cpus", default="", help="override the CPUs a policy manages (list format)")
    p.add_argument("--config-file", default="", help="policy configuration file (YAML)")
    p.add_argument(
        "--config-namespace",
        default="",
        help="namespace of the policy's custom resources (Kubernetes config source: not yet)",
    )
    p.add_argument("--config-group-label", default="config.nri/group")
    p.add_argument(
        "--sst-helper",
        default="",
        help="the SST helper's socket (ipc://PATH): cpuClasses are applied through it; "
        "without it they are only logged",
    )
    p.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    if args.config_namespace:
        log.warning(
            "--config-namespace %s: the Kubernetes config source is not implemented yet; ignored",
            args.config_namespace,
        )
    try:
        policy = load_policy(args.policy)
    except PolicyNotFound as exc:
        print(f"nri-resource-policy: {exc}", file=sys.stderr)
        return 2
    opts = StubOptions.from_environment(
        name=args.nri_plugin_name,
        index=args.nri_plugin_index,
        socket_path=args.nri_socket,
        reconnect=not args.exit_on_disconnect,
    )
    try:
        opts.validate()
    except ValueError as exc:
        print(f"nri-resource-policy: {exc}", file=sys.stderr)
        return 2
    host = PolicyHost(
        args.policy,
        policy,
        options={
            "cpus": args.cpus,
            "config_file": args.config_file,
            "sst_helper": args.sst_helper,
        },
        state_dir=args.state_dir,
        host_root=args.host_root,
    )
    return asyncio.run(serve(host, opts, args.config_file))


async def serve(host: PolicyHost, opts: StubOptions, config_file: str = "") -> int:
    stub = PluginStub(host, opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stub.stop)
    reloads: set[asyncio.Task[bool]] = set()

    def reload() -> None:
        """SIGHUP: re-read --config-file and reconfigure the running policy."""
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            log.error("cannot reload configuration: %s", exc)
            return
        task = loop.create_task(host.reconfigure(text, config_file))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    if config_file:
        loop.add_signal_handler(signal.SIGHUP, reload)
    mode = (
        f"pre-launched (fd {opts.fd})" if opts.fd is not None else f"external ({opts.socket_path})"
    )
    log.info("nri-resource-policy %s starting policy %s, %s", __version__, host.policy_name, mode)
    try:
        return await stub.run()
    finally:
        host.shutdown()


def policies(args: argparse.Namespace) -> int:
    infos = list_policies()
    if not infos:
        print("no policies installed")
        return 1
    for info in infos:
        print(f"{info.name} {info.version} ({info.distribution}: {info.target})")
        for hook in info.hooks:
            print(f"    {hook}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nri-resource-policy", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub)
    sub.add_parser("policies", help="list installed policies, versions and hooks")
    sim = sub.add_parser(
        "simulate", help="run Pod YAML through the runtime simulator", add_help=False
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    demo = sub.add_parser("demo", help="run a demo scenario", add_help=False)
    demo.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "simulate":
        from nri_framework.simulate.scenario import main as simulate_main

        rc: int = simulate_main(argv[1:])
        return rc
    if argv and argv[0] == "validate":
        from nri_balloons.validate_cli import main as validate_main

        rc = validate_main(argv[1:])
        return rc
    if argv and argv[0] == "demo":
        from nri_framework.demo import main as demo_main

        rc = demo_main(argv[1:])
        return rc
    parser = build_parser()
    args = parser.parse_args(argv)
    logsetup.setup(getattr(args, "log_level", None) or os.environ.get("NRI_LOG_LEVEL", "info"))
    if args.command == "run":
        return run(args)
    if args.command == "policies":
        return policies(args)
    parser.error(f"unknown command {args.command}")
    return 2
