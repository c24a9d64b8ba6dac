"""``nri-resource-policy``: run, simulate, inspect, list policies; and the
commands installed policies add (entry-point group
``nri_resource_policy.commands``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from nri_sst.retry import Backoff, Obstacle

from nri_framework import __version__, logsetup
from nri_framework.cmdline import Formatter, add_policy_flags, policy_name
from nri_framework.configfile import Reloader
from nri_framework.hookspecs import PolicyError
from nri_framework.host import PolicyHost
from nri_framework.instrumentation import Instrumentation, parse_address, start_instrumentation
from nri_framework.registry import (
    CommandUnavailable,
    PolicyNotFound,
    distribution,
    installed_commands,
    list_policies,
    load_command,
    load_policy,
)
from nri_framework.startup import (
    PeerWatch,
    Startup,
    settle_heap,
    state_dir_obstacle,
    sysfs_obstacle,
)
from nri_framework.stub import DEFAULT_SOCKET, PluginStub, StubOptions

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from nri_framework.agent.options import AgentOptions

log = logging.getLogger("nri_framework.cli")

#: the framework's own commands; the rest come from entry points
BUILTIN = ("run", "policies", "simulate", "inspect")


def add_run_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], policy: tuple[str, object] | None
) -> None:
    """``run``'s flags, then ``policy``'s (its name and plugin) own (the hook
    ``policy_addoption``)."""
    p = sub.add_parser(
        "run",
        help="run a policy as an NRI plugin",
        description="Run a policy as an NRI plugin. run --policy NAME --help also lists "
        "the flags of the policy NAME.",
        formatter_class=Formatter,
    )
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
    p.add_argument("--config-file", default="", help="policy configuration file (YAML)")
    p.add_argument(
        "--config-namespace",
        default="",
        help="take the configuration from the policy's custom resources (BalloonsPolicy "
        "node.$NODE_NAME > group.<label> > default) in this namespace, report status there, "
        "publish NodeResourceTopology and extended resources; default: kube-system in a pod "
        "(KUBERNETES_SERVICE_HOST set), else no cluster access. Unused with --config-file",
    )
    p.add_argument("--config-group-label", default="config.nri/group")
    p.add_argument(
        "--kubeconfig",
        default="",
        help="kubeconfig file for the agent; default: the pod's service account in a "
        "cluster, else $KUBECONFIG or ~/.kube/config",
    )
    p.add_argument(
        "--metrics-address",
        default="",
        help="serve /healthz, /metrics and /debug/state over HTTP at HOST:PORT (':PORT': "
        "every interface, as the chart's config.instrumentation.httpEndpoint ':8891'), "
        "whatever the policy's configuration names; empty (default): where the "
        "configuration names (balloons: instrumentation.httpEndpoint), if anywhere",
    )
    p.add_argument(
        "--retry-interval",
        default="0.5:10",
        metavar="INITIAL[:MAX]",
        help="seconds between attempts to reach the runtime's socket or a path the start "
        "needs (sysfs, the state directory), doubling from INITIAL up to MAX (default 0.5:10)",
    )
    p.add_argument("--log-level", default="info")
    if policy is not None:
        add_policy_flags(p, *policy)


def run(args: argparse.Namespace, policy: object) -> int:
    opts = StubOptions.from_environment(
        name=args.nri_plugin_name,
        index=args.nri_plugin_index,
        socket_path=args.nri_socket,
        reconnect=not args.exit_on_disconnect,
    )
    try:
        opts.validate()
        if args.metrics_address:
            parse_address(args.metrics_address)
        backoff = Backoff.parse(args.retry_interval)
    except ValueError as exc:
        print(f"nri-resource-policy: {exc}", file=sys.stderr)
        return 2
    opts.backoff_initial, opts.backoff_max = backoff.initial, backoff.maximum
    from nri_framework.agent.options import agent_options

    agent = agent_options(
        config_file=args.config_file,
        namespace=args.config_namespace,
        group_label=args.config_group_label,
        kubeconfig=args.kubeconfig,
        environ=os.environ,
    )

    def make_host() -> PolicyHost:
        return PolicyHost(
            args.policy,
            policy,
            options=args,
            state_dir=args.state_dir,
            host_root=args.host_root,
        )

    checks: list[Callable[[], Obstacle | None]] = [lambda: sysfs_obstacle(args.host_root)]
    if args.state_dir:
        checks.append(lambda: state_dir_obstacle(args.state_dir))
    startup = Startup(checks, backoff=backoff, host_root=args.host_root)
    return asyncio.run(
        start(
            startup,
            make_host,
            opts,
            args.config_file,
            args.metrics_address,
            agent=agent,
            policy=args.policy,
        )
    )


async def start(
    startup: Startup,
    make_host: Callable[[], PolicyHost],
    opts: StubOptions,
    config_file: str = "",
    metrics_address: str = "",
    *,
    agent: AgentOptions | None = None,
    policy: str = "",
) -> int:
    """Start the policy host once the pod has what it needs (``startup``
    retries meanwhile, ``/healthz`` says what is missing), then :func:`serve`."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, startup.stop)
    instrumentation = await start_instrumentation(None, None, metrics_address, startup=startup)
    try:
        try:
            host = await startup.wait(make_host)
        except PolicyError as exc:  # e.g. an invalid --config-file: the text says why
            log.error("cannot start policy %s: %s", policy, exc)
            return 1
        if host is None:
            return 0
        settle_heap()  # the imports, the policy and its topology live as long as the process
        return await serve(
            host, opts, config_file, metrics_address, agent=agent, instrumentation=instrumentation
        )
    finally:
        if instrumentation is not None:
            await instrumentation.close()


async def serve(
    host: PolicyHost,
    opts: StubOptions,
    config_file: str = "",
    metrics_address: str = "",
    *,
    agent: AgentOptions | None = None,
    instrumentation: Instrumentation | None = None,
) -> int:
    """Serve the runtime until SIGTERM/SIGINT. With ``agent``, the Kubernetes
    agent runs too and the policy's first configuration comes from the
    cluster: registration with the runtime waits for it. ``instrumentation``:
    the endpoint already serving (the start-up's), else one is started."""
    stub = PluginStub(host, opts)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stub.stop)
    reloader = None
    if config_file:  # SIGHUP: re-read --config-file, off the event loop
        reloader = Reloader(host, config_file)
        reloader.start()
        loop.add_signal_handler(signal.SIGHUP, reloader.request)
    mode = (
        f"pre-launched (fd {opts.fd})" if opts.fd is not None else f"external ({opts.socket_path})"
    )
    log.info("nri-resource-policy %s starting policy %s, %s", __version__, host.policy_name, mode)
    peer = host.hook.policy_peer()
    watch = (
        None if peer is None else PeerWatch(peer, Backoff(opts.backoff_initial, opts.backoff_max))
    )
    if instrumentation is None:
        instrumentation = await start_instrumentation(host, stub, metrics_address)
    if instrumentation is None:  # no --metrics-address (or not bindable): the configuration's
        instrumentation = Instrumentation(host, stub, "", override=metrics_address)
    instrumentation.attach(host, stub, watch)
    host.add_config_listener(instrumentation.follow_policy)
    instrumentation.follow_policy()  # the configuration policy_start applied
    k8s = None
    if watch is not None:
        watch.start()
    try:
        if agent is not None:
            from nri_framework.agent.agent import Agent

            k8s = Agent(host, agent)
            try:
                await k8s.start()
            except Exception as exc:
                log.error("cannot start the Kubernetes agent: %s", exc)
                return 1
            log.info("waiting for the configuration from the cluster...")
            if not await k8s.wait_configured(stub.stopping):
                return 0
        return await stub.run()
    finally:
        if watch is not None:
            await watch.stop()
        if reloader is not None:
            await reloader.stop()
        if k8s is not None:
            await k8s.stop()
        if instrumentation is not None:
            await instrumentation.close()
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
    commands = {n: ep for n, ep in installed_commands().items() if n not in BUILTIN}
    if commands:
        print("commands:")
    for name, ep in commands.items():
        print(f"    {name} ({distribution(ep)}: {ep.value})")
    return 0


def not_installed(exc: ModuleNotFoundError, command: str, package: str, what: str) -> int:
    """Exit status 2 and a clear line when ``package`` is the missing module
    (a command whose code this installation leaves out); else ``exc`` again."""
    if exc.name != package and not (exc.name or "").startswith(package + "."):
        raise exc
    msg = f"nri-resource-policy {command}: {what} ({package}) is not installed in this image"
    print(msg, file=sys.stderr)
    return 2


def build_parser(
    policy: tuple[str, object] | None = None, *, describe: bool = False, commands: bool = True
) -> argparse.ArgumentParser:
    """The command line; ``policy`` (the name and plugin of ``run --policy``)
    adds its flags to ``run``. ``describe``: load the installed commands for
    their help lines (only for the top-level ``--help``). ``commands``: list
    the installed commands at all (``run`` does not need them: their lookup
    would import :mod:`importlib.metadata` before the plugin registers)."""
    parser = argparse.ArgumentParser(
        prog="nri-resource-policy", description=__doc__, formatter_class=Formatter
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_parser(sub, policy)
    sub.add_parser(
        "policies", help="list installed policies, versions and hooks", formatter_class=Formatter
    )
    sim = sub.add_parser(
        "simulate",
        help="run Pod YAML through the runtime simulator",
        add_help=False,
        formatter_class=Formatter,
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    inspect = sub.add_parser(
        "inspect",
        help="print a running plugin's balloons, containers and CPUs",
        add_help=False,
        formatter_class=Formatter,
    )
    inspect.add_argument("rest", nargs=argparse.REMAINDER)
    for name, ep in (installed_commands() if commands else {}).items():
        if name not in BUILTIN:
            about = describe_command(ep) if describe else f"from {distribution(ep)}"
            command = sub.add_parser(name, help=about, add_help=False, formatter_class=Formatter)
            command.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def describe_command(ep: EntryPoint) -> str:
    """The help line of an installed command: the first line of its callable's
    documentation, else of its module's."""
    try:
        command = load_command(ep)
    except CommandUnavailable as exc:
        return str(exc)
    module = sys.modules.get(getattr(command, "__module__", "") or "")
    doc = (command.__doc__ or getattr(module, "__doc__", None) or "").strip()
    first = doc.splitlines()[0].replace("``", "") if doc else ""
    return f"{first} ({distribution(ep)})" if first else f"from {distribution(ep)}"


def run_command(name: str, argv: list[str]) -> int | None:
    """The installed command ``name`` run with ``argv``; ``None`` when there
    is no such command."""
    ep = installed_commands().get(name)
    if ep is None:
        return None
    try:
        command = load_command(ep)
    except CommandUnavailable as exc:
        print(f"nri-resource-policy: {exc}", file=sys.stderr)
        return 2
    return command(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    running = bool(argv) and argv[0] == "run"
    if not running:
        settle_heap()  # the launch paused the collector for the imports (nri_framework.launch)
    if argv and argv[0] == "simulate":
        try:
            from nri_framework.simulate.scenario import main as simulate_main
        except ModuleNotFoundError as exc:  # the plugin image ships no simulator
            return not_installed(exc, "simulate", "nri_framework.simulate", "the simulator")
        rc: int = simulate_main(argv[1:])
        return rc
    if argv and argv[0] == "inspect":
        from nri_framework.inspect_cli import main as inspect_main

        rc = inspect_main(argv[1:])
        return rc
    if (
        argv
        and argv[0] not in BUILTIN
        and (rc_or_none := run_command(argv[0], argv[1:])) is not None
    ):
        return rc_or_none
    if not running:
        return _command(argv, None)
    # run: the collector stays paused (nri_framework.launch) through the policy's
    # import and its start (topology, configuration, saved state): start() settles
    # the heap once the host is made, this when the run ends before
    try:
        policy: tuple[str, object] | None = None
        if name := policy_name(argv[1:]):
            try:
                policy = (name, load_policy(name))
            except PolicyNotFound as exc:
                print(f"nri-resource-policy: {exc}", file=sys.stderr)
                return 2
        return _command(argv, policy)
    finally:
        settle_heap()


def _command(argv: list[str], policy: tuple[str, object] | None) -> int:
    try:
        parser = build_parser(
            policy,
            describe=not argv or argv[0] in ("-h", "--help"),
            commands=not argv or argv[0] != "run",
        )
    except PolicyError as exc:
        print(f"nri-resource-policy: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logsetup.setup(getattr(args, "log_level", None) or os.environ.get("NRI_LOG_LEVEL", "info"))
    if args.command == "run":
        assert policy is not None  # --policy is required: the parse stops without it
        return run(args, policy[1])
    if args.command == "policies":
        return policies(args)
    parser.error(f"unknown command {args.command}")
    return 2
