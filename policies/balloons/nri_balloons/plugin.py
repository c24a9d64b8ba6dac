"""The balloons policy as a pluggy plugin of the host.

Entry point ``balloons`` in the group ``nri_resource_policy.policies``. The
configuration comes from ``--config-file`` (a BalloonsPolicy YAML), or from
the runtime's plugin configuration text for pre-launched plugins. The
Kubernetes source is the agent (``nri_framework.agent``: BalloonsPolicy custom
resources in ``--config-namespace``), which hands them over through
``policy_reconfigure``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING, Any

from nri_framework import cpuset
from nri_framework.cmdline import typed_options
from nri_framework.configfile import ConfigFileError, read_config_file
from nri_framework.contract import Peer
from nri_framework.eventloop import running_loop
from nri_framework.hookspecs import PolicyError, hookimpl
from nri_framework.host import PolicyHost
from nri_framework.journal import StateChanges
from nri_framework.model import (
    Adjustment,
    Container,
    ContainerState,
    CreateResult,
    Pod,
    Resources,
    RuntimeInfo,
    Update,
    cpu_pin,
)
from nri_framework.nri.versions import runtime_nri_version
from nri_framework.topology import Topology
from nri_framework.zones import Zone

from nri_balloons import (
    configcache,
    cpupriority,
    irqaffinity,
    rdtblockio,
    rdtpartitions,
    scheduling,
)
from nri_balloons.busyfreq import BusyFrequency
from nri_balloons.cmdline import BalloonsOptions, add_flags, helper_peer
from nri_balloons.configdecode import ConfigError
from nri_balloons.cpuclass import HelperWriter, NullWriter, Writer
from nri_balloons.devices import pod_resource_entries
from nri_balloons.endpoint import asked_endpoint
from nri_balloons.extres import extended_resources
from nri_balloons.features import unimplemented
from nri_balloons.irqaffinity import IrqAffinity
from nri_balloons.nrt import zones
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.sstlink import (
    REPLY_BUDGET,
    Backoff,
    Budget,
    Steps,
    T,
    Wait,
    exchange,
    exchange_async,
    together,
)
from nri_balloons.validation import PreparedConfig, validate

if TYPE_CHECKING:
    from nri_framework.agent.podresources import PodResourcesClient

    from nri_balloons.balloon import Balloon

__version__ = "0.1.0"

PROBE_INTERVAL = 1.0
"""Seconds between checks that the SST helper is still the process SST was
programmed on (a restarted helper may come back with SST reset), off the
reply path, one ``GetAssociation`` of one CPU. It is also how a dead helper
is noticed (``pct_degraded``) while decisions send it nothing (cores already
on their CLOS): within about a second. While the background backs off after
a failed commit, the probe cuts its pause short instead (and the background
probes first): a helper gone or back is noticed at this pace, whatever the
backoff has grown to."""
CONFIG_TIMEOUT = 1.0
"""Per helper request off the reply path: the background's commits, and the
configuration applied at start-up before the event loop runs."""
IRQ_LIST_TIMEOUT = 0.25
"""Seconds ``policy_start`` waits for the helper's IRQ list when its
configuration uses ``irqClaim``/``irqMode`` (the start-up discovery has waited
for the helper already; an absent one is listed later)."""
RETRY_MIN = 0.5
RETRY_MAX = 10.0
"""Seconds between background commits while the SST helper is away
(doubling): how often a failing helper is asked when nothing else asks
(the probe, while PCT is configured, asks every PROBE_INTERVAL)."""
ALL_LOGGERS = ("policy", "cpuclass", "irq", "libmem", "nri_framework")
MAX_REPORTED = 20
"""Errors (and warnings) of one configuration that are reported."""

log = logging.getLogger("policy")


def first_few(messages: list[str], limit: int = MAX_REPORTED) -> list[str]:
    """At most ``limit`` messages and a count of the rest: a hostile file can
    make thousands, and each lands in a log line or a custom resource's status."""
    if len(messages) <= limit:
        return messages
    return [*messages[:limit], f"... and {len(messages) - limit} more"]


class Balloons:
    """Hook implementations; the placement logic is :class:`BalloonsPolicy`."""

    __version__ = __version__

    def __init__(self) -> None:
        self.host: PolicyHost | None = None
        self.options = BalloonsOptions()
        """the command line's (``policy_start``)"""
        self.policy: BalloonsPolicy | None = None
        self.pins: dict[str, tuple[str, str]] = {}
        self.runtime_nri: tuple[int, ...] = ()
        self.scheduling_warned = False
        self.background: asyncio.Task[None] | None = None
        """the background commit (see "cpuClasses and the SST helper")"""
        self._steps: Steps[Any] | None = None
        """the steps the background awaits"""
        self.retry = Backoff()
        """the background's pause after a failed commit (the probe cuts it short)"""
        self.rediscovery_retry = Backoff()
        """the CPU priorities' rediscovery's pause (the probe cuts it short)"""
        self.frequencies = BusyFrequency()
        """the helper's frequency readings of each scrape (nri_balloons.busyfreq)"""
        self.probe: asyncio.TimerHandle | None = None
        self.debugging: set[str] = set()
        self.no_helper_warned = False
        self.sst_missed = False
        """the SST helper was away at start: its CPU priorities may come later"""
        self.rediscovery: asyncio.Task[None] | None = None
        self.irq = IrqAffinity()
        """IRQ affinities (irqClaim, irqMode), written through the helper"""
        self.no_helper_irq_warned = False
        self.rdt = rdtpartitions.RdtPartitions()
        """resctrl groups of control.rdt partitions, written through the helper"""
        self.podres: PodResourcesClient | None = None
        """the kubelet's pod-resources cache, while ``agent.podResourceAPI`` is on"""
        self.late: set[str] = set()
        """containers told of a pod-resources answer that came after their placement"""

    # -- cpuClasses and the SST helper ----------------------------------------------
    #
    # A hook on the event loop waits for the helper at most REPLY_BUDGET in
    # total (its configure's SST programming and its commit together). What
    # is left (the helper away or slow, a restarted helper to program again)
    # is the background's: one asyncio task awaiting the asyncio client, until
    # every decision is applied. While it runs, hooks only record decisions
    # (the background applies them all when done); a new configuration first
    # stops it, so configurations never change under its feet.

    def _reply_path(self, reconfigures: bool = False) -> Wait:
        """How a hook's helper exchanges wait (passed to each of its calls):
        the reply budget on the event loop, one for the whole hook; before
        the loop runs (``policy_start``: nothing waits) CONFIG_TIMEOUT per
        request. ``reconfigures``: stop the background."""
        if reconfigures:
            self._stop_background()
        if running_loop() is None:
            return Wait(timeout=CONFIG_TIMEOUT)
        # never more than the host allows of the runtime's request timeout
        budget = REPLY_BUDGET if self.host is None else self.host.reply_budget(REPLY_BUDGET)
        return Wait(budget=Budget(budget))

    def commit(self, wait: Wait) -> None:
        """Apply the CPU class decisions of the hook that just ran (one commit
        per hook, within the hook's ``wait``: one helper request). What the
        helper did not take goes to the background. The hook's PCT
        placement lines are logged first, committed or not."""
        if self.policy is not None:
            self.policy.cpu_classes.pct.log_placed()
        if self.sst_missed and self.rediscovery is None and running_loop() is not None:
            self.rediscovery = asyncio.get_running_loop().create_task(self._rediscover())
        if self.policy is None or self.background is not None:
            return
        writer = self.policy_writer()
        if isinstance(writer, NullWriter) and writer.silent():
            return  # no helper, no debug lines: the CPUs stay dirty for them
        self._end_commit(all(exchange(self.commit_steps(wait.timeout), writer, wait.budget)))

    def _end_commit(self, ok: bool) -> None:
        assert self.policy is not None
        self.report_late_denied_claims()
        loop = running_loop()
        if loop is None:
            return
        if self.probe is None and self.policy.cpu_classes.pct.wanted_mode:
            self.probe = loop.call_later(PROBE_INTERVAL, self._probe)
        if not ok:
            self._start_background()

    def decide_irqs(self) -> None:
        """The IRQ affinities the balloons want now (reference §11)."""
        assert self.policy is not None
        prepared = self.policy.config
        if prepared is None:
            return
        self.irq.decide(
            prepared.balloon_types,
            [(b.bdef, b.cpus) for b in self.policy.balloons],
            self.policy.allowed,
            prepared.spec.controllable_interrupts,
        )

    def commit_steps(self, timeout: float | None = None) -> Steps[list[bool]]:
        """Everything the decisions ask of the helper, side by side: the CPU
        classes and PCT, the IRQ affinities (reference §11) and the resctrl
        configuration of control.rdt when it changed; their writes go in one
        request (:func:`~nri_balloons.sstlink.together`). Each one's result:
        False when it was left to the background."""
        assert self.policy is not None
        steps: list[Steps[bool]] = [self.policy.cpu_classes.commit_steps(timeout)]
        if not isinstance(self.policy_writer(), NullWriter):
            self.decide_irqs()
            steps.append(self.irq.commit_steps(timeout))
            if self.policy.config is not None:
                self.rdt.decide(self.policy.config.spec.control.rdt)
            steps.append(self.rdt.commit_steps(timeout))
        results: list[bool] = yield from together(*steps)
        return results

    def check_rdt(self, prepared: PreparedConfig, wait: Wait) -> None:
        """control.rdt partitions resolved against resctrl's ``info`` (read
        through the helper) before the configuration is taken: goresctrl's
        error refuses it (the running one stays). A helper that does not
        answer now: the commit resolves it later (an error is then logged)."""
        rdt = prepared.spec.control.rdt
        writer = self.policy_writer()
        if isinstance(writer, NullWriter):
            if rdtpartitions.wanted(rdt):
                log.warning(
                    "control.rdt partitions are configured but there is no SST helper "
                    "(--sst-helper): resctrl is written through the helper; it is left as it is"
                )
            return
        if rdt == self.rdt.rdt:
            return
        timeout = IRQ_LIST_TIMEOUT if wait.budget is None else None
        error = exchange(self.rdt.check_steps(rdt, timeout), writer, wait.budget)
        if error:
            raise PolicyError(error)

    def helper_writer(self, endpoint: str) -> Writer:
        """The writer of ``--sst-helper`` (the unit tests' in-process helper
        stands in for its socket here)."""
        return HelperWriter(endpoint)

    def policy_writer(self) -> Writer:
        assert self.policy is not None
        return self.policy.cpu_classes.writer

    def report_late_denied_claims(self) -> None:
        """IRQs listed only after the configuration was applied (the helper was
        away): its claims on denied IRQs are reported now, as errors."""
        if not self.irq.listed_late or self.policy is None or self.policy.config is None:
            return
        self.irq.listed_late = False
        denied, unmatched = self.irq_claim_findings(self.policy.config)
        for error in first_few(denied):
            log.error("%s", error)
        for warning in first_few(unmatched):
            log.warning("%s", warning)

    def denied_claims(self, prepared: PreparedConfig) -> list[str]:
        """The configuration's claims on IRQs ``controllableInterrupts`` denies
        (upstream's validation errors), against the IRQs listed last."""
        return self.irq_claim_findings(prepared)[0]

    def irq_claim_findings(self, prepared: PreparedConfig) -> tuple[list[str], list[str]]:
        """Against the IRQs listed last: the claims on denied IRQs (upstream's
        validation errors) and the claims that match no IRQ (warnings)."""
        assert self.policy is not None
        result = validate(
            prepared.spec,
            online_cpus=self.policy.topology.online,
            interrupts=self.irq.descriptions(),
        )
        return (
            [e for e in result.errors if e.startswith("invalid irqclaim")],
            [w for w in result.warnings if "matches no interrupt" in w],
        )

    def check_irq_claims(self, prepared: PreparedConfig, wait: Wait) -> None:
        """A configuration that uses ``irqClaim``/``irqMode`` while the IRQs are
        not known yet (``prepare`` checked its claims without them): the list
        is asked for now, within ``wait``, and a claim on a denied IRQ refuses
        the configuration. Nothing is asked for a configuration without IRQ
        options. A helper that does not answer now: the commit lists them
        later (the denied claims are then logged)."""
        assert self.policy is not None
        writer = self.policy_writer()
        if (
            self.irq.irqs is not None
            or isinstance(writer, NullWriter)
            or not irqaffinity.in_use(prepared.balloon_types)
        ):
            return
        timeout = IRQ_LIST_TIMEOUT if wait.budget is None else None
        if not exchange(self.irq.list_steps(timeout), writer, wait.budget):
            return
        denied, unmatched = self.irq_claim_findings(prepared)
        if denied:
            raise PolicyError("; ".join(first_few(denied)))
        for warning in first_few(unmatched):
            log.warning("%s", warning)

    def _start_background(self, probe: bool = False) -> None:
        if self.background is None:
            self.background = asyncio.get_running_loop().create_task(self._settle(probe))

    def _stop_background(self) -> None:
        """Abandon the background's steps where they wait (their CPUs stay
        pending: the request's outcome is unknown) and cancel it."""
        task, self.background = self.background, None
        if task is None:
            return
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        task.cancel()

    async def _exchange(self, steps: Steps[T]) -> T:
        assert self.policy is not None
        self._steps = steps
        try:
            return await exchange_async(steps, self.policy.cpu_classes.writer)
        finally:
            if self._steps is steps:
                self._steps = None

    async def _settle(self, probe: bool) -> None:
        """The background: commit everything, CONFIG_TIMEOUT per request,
        until no decision waits; while the helper is away again after a
        growing delay, cut short by the probe (then PCT's probe goes first:
        an outage or a restarted helper is noticed even when the commit has
        nothing of PCT to send). ``probe``: first ask whether anything is
        needed."""
        assert self.policy is not None
        handler = self.policy.cpu_classes
        delay = RETRY_MIN
        try:
            if probe and not await self._exchange(handler.pct.probe_steps()):
                return
            while True:
                done = all(await self._exchange(self.commit_steps(CONFIG_TIMEOUT)))
                self.report_late_denied_claims()
                if done:
                    if (
                        not handler.unsettled()
                        and not self.irq.unsettled()
                        and not self.rdt.unsettled()
                    ):
                        # PCT is settled now: what the agent publishes from it
                        # (extended resources, NRT) is due again
                        if self.host is not None:
                            self.host.changed()
                        return
                    continue  # decisions taken meanwhile
                if await self.retry.until_woken(delay):
                    await self._exchange(handler.pct.probe_steps())
                delay = min(delay * 2, RETRY_MAX)
        finally:
            if self.background is asyncio.current_task():
                self.background = None

    async def _rediscover(self) -> None:
        """The SST helper was away at start: read its CPU priorities once it is
        there (on a session of its own), for the allocations from then on."""
        assert self.policy is not None
        writer = HelperWriter(self.options.sst_helper)
        try:
            prios = await cpupriority.rediscover(
                self.policy.topology, writer, self.rediscovery_retry.pause
            )
        finally:
            writer.close()
        self.sst_missed = False
        if prios is not None:
            self.policy.use_priorities(prios)

    def _probe(self) -> None:
        """Every PROBE_INTERVAL while PCT is configured: a restarted helper
        is noticed (and programmed again) even when no container changes; a
        background or a rediscovery that backs off is woken."""
        self.probe = None
        if self.policy is None or not self.policy.cpu_classes.pct.wanted_mode:
            return
        self.rediscovery_retry.wake()
        if self.background is None:
            self._start_background(probe=True)
        else:
            self.retry.wake()
        self.probe = asyncio.get_running_loop().call_later(PROBE_INTERVAL, self._probe)

    # -- configuration -----------------------------------------------------------

    def prepare(self, text: str, source: str, *, cache: bool = False) -> PreparedConfig:
        """Parse and validate a configuration; raises PolicyError with every error.

        Reads nothing but the topology (and, with ``cache``, the state
        directory's :mod:`~nri_balloons.configcache`: the configuration file's
        document as last parsed): safe in the host's worker thread
        (:meth:`policy_prepare_config`). Parsing is bounded in depth, size
        and time (:func:`~nri_balloons.configyaml.parse_policy`; without ``cache`` the
        state directory is neither read nor written)."""
        assert self.policy is not None
        host = self.host if cache else None
        state_dir, name = (host.state_dir, host.policy_name) if host is not None else (None, "")
        try:
            doc = configcache.load_policy(state_dir, name, text, source=source)
        except ConfigError as exc:
            raise PolicyError("\n".join(first_few(exc.errors))) from None
        result = validate(
            doc, online_cpus=self.policy.topology.online, interrupts=self.irq.descriptions()
        )
        for warning in first_few([*result.warnings, *unimplemented(doc.spec)]):
            log.warning("%s", warning)
        if result.prepared is None:
            raise PolicyError("; ".join(first_few(result.errors)))
        return result.prepared

    def debug_loggers(self, names: list[str]) -> None:
        """``log.debug`` of the configuration: these loggers (``policy``,
        ``cpuclass``, ``nri_framework``; ``*``/``all`` for those three) log at
        debug level; the ones a previous configuration named go back to the
        level of ``--log-level``."""
        wanted: set[str] = set()
        for name in names:
            wanted |= set(ALL_LOGGERS) if name in ("*", "all") else {name}
            if name == "cpu":
                # upstream's cpuClass/PCT lines are under "cpuclass"; the spec's
                # ``log.debug: [policy, cpu]`` expects them (reference §20.4)
                wanted.add("cpuclass")
            if name == "podresapi":  # upstream's logger of its pod-resources client
                wanted.add("nri_framework.podresources")
        for name in self.debugging - wanted:
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name in wanted - self.debugging:
            logging.getLogger(name).setLevel(logging.DEBUG)
        self.debugging = wanted

    def warn_no_helper(self, prepared: PreparedConfig) -> None:
        """cpuClasses without ``--sst-helper``: say once that nothing is written."""
        assert self.policy is not None
        if (
            prepared.spec.cpu_classes
            and isinstance(self.policy.cpu_classes.writer, NullWriter)
            and not self.no_helper_warned
        ):
            self.no_helper_warned = True
            log.warning(
                "cpuClasses are configured but there is no SST helper (--sst-helper): "
                "their frequencies, C-states and uncore limits are not applied"
            )

    def warn_no_helper_irqs(self, prepared: PreparedConfig) -> None:
        """irqClaim/irqMode without ``--sst-helper``: say once that IRQs are left alone."""
        assert self.policy is not None
        if (
            irqaffinity.in_use(prepared.balloon_types)
            and isinstance(self.policy.cpu_classes.writer, NullWriter)
            and not self.no_helper_irq_warned
        ):
            self.no_helper_irq_warned = True
            log.warning(
                "irqClaim/irqMode are configured but there is no SST helper (--sst-helper): "
                "IRQ affinity is written through the helper; interrupts are left as they are"
            )

    def apply(self, prepared: PreparedConfig) -> None:
        """Set ``prepared`` up (the helper exchanges within the hook's context)."""
        assert self.policy is not None
        self.debug_loggers(prepared.spec.log.debug)
        self.warn_no_helper(prepared)
        self.warn_no_helper_irqs(prepared)
        self.pod_resources(prepared)
        wait = self._reply_path()
        self.check_irq_claims(prepared, wait)
        self.check_rdt(prepared, wait)
        self._stop_background()
        try:
            self.policy.set_config(prepared, wait)
        except BalloonsError as exc:
            raise PolicyError(f"balloons: failed to create balloons policy: {exc}") from None
        finally:
            self.commit(wait)

    def reconfigure(
        self, text: str, source: str, prepared: PreparedConfig | None = None
    ) -> list[Update]:
        """A new configuration for the running plugin (what the agent delivers
        when the BalloonsPolicy changes); the updates of the containers it moved.

        Raises PolicyError for an invalid configuration, or one the policy
        cannot set up (``balloons: config update failed: ...``); the running
        configuration stays then."""
        assert self.policy is not None and self.host is not None
        if prepared is None:
            prepared = self.prepare(text, source)
        self.debug_loggers(prepared.spec.log.debug)
        self.warn_no_helper(prepared)
        self.warn_no_helper_irqs(prepared)
        self.pod_resources(prepared)
        pods = self.host.pods
        running = [
            (pods.get(c.pod_sandbox_id) or Pod(id=c.pod_sandbox_id), c)
            for c in self.host.containers.values()
            if c.state != ContainerState.STOPPED
        ]
        wait = self._reply_path()
        self.check_irq_claims(prepared, wait)
        self.check_rdt(prepared, wait)
        self._stop_background()
        try:
            self.policy.reconfigure(prepared, running, wait)
        except BalloonsError as exc:
            if self.policy.config is not None:  # the running one stays, and its API use
                self.pod_resources(self.policy.config)
            raise PolicyError(str(exc)) from None
        finally:
            self.commit(wait)
        return self._updates()

    # -- the kubelet's pod-resources API (podresourceapi: hints) -----------------------
    #
    # The client's task keeps a cache current (a List now and then, a Get at
    # each RunPodSandbox); the policy reads the cache alone, so no NRI reply
    # waits on the kubelet. A container created before its pod's answer is
    # placed without the hint (upstream's debug line), and stays where it is
    # when the answer comes: the hints steer the next placement.

    def pod_resources(self, prepared: PreparedConfig) -> None:
        """Run the pod-resources client while the configuration wants it."""
        assert self.policy is not None and self.host is not None
        if not prepared.spec.agent.pod_resource_api:
            if self.podres is not None:
                self.podres.stop()
                self.podres = None
            self.policy.pod_devices = None
            return
        if self.podres is None:
            from nri_framework.agent.podresources import PodResourcesClient, socket_path

            path = socket_path(self.host.host_root, self.options.pod_resources_socket)
            log.info("podresourceapi: hints read the kubelet's pod-resources API at %s", path)
            self.podres = PodResourcesClient(path, on_update=self._pod_resources_arrived)
        self.policy.pod_devices = self.podres.cache.devices
        self._start_pod_resources()

    def _start_pod_resources(self) -> None:
        if self.podres is not None and running_loop() is not None:
            self.podres.start()

    def _pod_resources_arrived(self, namespace: str, pod: str) -> None:
        """An answer for ``pod`` (after a List: every pod) landed in the cache."""
        if self.policy is None or self.podres is None:
            return
        self.late &= set(self.policy.owner)  # once per container while it lives
        for bln in self.policy.balloons:
            if not pod_resource_entries(bln.bdef.prefer_close_to_devices):
                continue
            for m in bln.members.values():
                if (namespace, pod) not in (("", ""), (m.namespace, m.pod_name)):
                    continue
                if bln.name in self.policy.device_hints or m.id in self.late:
                    continue
                devices = self.podres.cache.devices(m.namespace, m.pod_name, m.name)
                if devices:
                    self.late.add(m.id)
                    log.info(
                        "pod-resources of container %s arrived after it was placed in %s: "
                        "its podresourceapi: hints steer the next placement",
                        m.pretty,
                        bln.name,
                    )

    @hookimpl
    def nri_run_pod_sandbox(self, pod: Pod) -> None:
        if self.podres is not None:
            self._start_pod_resources()
            self.podres.want(pod.namespace, pod.name)

    @hookimpl
    def nri_remove_pod_sandbox(self, pod: Pod) -> None:
        if self.podres is not None:
            self.podres.forget(pod.namespace, pod.name)

    @hookimpl
    def policy_prepare_config(self, config: str, source: str) -> PreparedConfig:
        return self.prepare(config, source)

    @hookimpl
    def policy_reconfigure(
        self, config: str, source: str, prepared: PreparedConfig | None
    ) -> list[Update]:
        log.info("configuration update")
        updates = self.reconfigure(config, source, prepared)
        log.info("config updated successfully")
        return updates

    @hookimpl
    def policy_addoption(self, parser: argparse.ArgumentParser) -> None:
        add_flags(parser)

    @hookimpl
    def policy_peer(self) -> Peer | None:
        return helper_peer(self.options)

    @hookimpl
    def policy_start(self, host: PolicyHost) -> None:
        log.info("setting up balloons policy...")
        self.host = host
        self.options = typed_options(BalloonsOptions, host.options)
        endpoint = self.options.sst_helper
        writer: Writer
        if endpoint:
            log.info("cpuClasses are applied through the SST helper at %s", endpoint)
            writer = self.helper_writer(endpoint)
            host.observe(StartAfterCommit())
        else:
            writer = NullWriter()
        topology = Topology.from_sysfs(host.host_root)
        # CPU priorities once at start (upstream's cpuallocator), before any NRI
        # request: SST through the helper, within DISCOVER_BUDGET; else cpufreq
        priorities, self.sst_missed = cpupriority.discover_at_start(topology, writer)
        self.policy = BalloonsPolicy(topology, host.host_root, writer=writer, priorities=priorities)
        # until the runtime's Synchronize names the running containers, SST is
        # programmed but no CPU re-associated (a restarted plugin would send
        # running HP pods' CPUs to the idle class meanwhile)
        self.policy.cpu_classes.pct.hold = True
        path = self.options.config_file
        if path:
            try:
                text = read_config_file(path)
            except ConfigFileError as exc:
                raise PolicyError(str(exc)) from None
            self.apply(self.prepare(text, path, cache=True))
        log.info("balloons policy started")

    @hookimpl
    def nri_configure(self, config: str, runtime: RuntimeInfo) -> None:
        assert self.policy is not None
        self.runtime_nri = runtime_nri_version(runtime.name, runtime.version, runtime.nri_version)
        self._start_pod_resources()
        if config.strip() and self.policy.config is None:
            self.apply(self.prepare(config, "runtime plugin configuration"))
        if self.policy.config is None:
            raise PolicyError(
                "balloons: no configuration (use --config-file, or --config-namespace with a "
                "BalloonsPolicy in the cluster)"
            )

    # -- NRI -------------------------------------------------------------------------

    def _updates(self, skip: str = "") -> list[Update]:
        """Updates for every container whose pinning changed since it was last
        sent, looking at what the decisions since changed alone
        (:meth:`BalloonsPolicy.pinning_changes`)."""
        assert self.policy is not None
        assert self.host is not None
        changes = self.policy.pinning_changes(self.host.pods.get, self.host.take_sent_pods())
        updates = []
        pins = self.pins
        for cid, pin in changes.items():
            if pin is None:
                pins.pop(cid, None)
                continue
            if cid != skip and pins.get(cid) != pin:
                updates.append(Update(container_id=cid, resources=cpu_pin(*pin)))
            pins[cid] = pin
        return updates

    def _all_updates(self) -> list[Update]:
        """After Synchronize: updates for every container the policy pins
        where the runtime does not report that pinning already (a restarted
        plugin that restored its decisions re-pins nothing; upstream sends
        the containers whose resources changed)."""
        assert self.policy is not None
        assert self.host is not None
        self.host.take_sent_pods()
        self.pins = self.policy.pinning(self.host.pods.get)
        reported = self.host.containers
        updates = []
        for cid, pin in self.pins.items():
            c = reported.get(cid)
            if c is not None and _has_pin(c, *pin):
                continue
            updates.append(Update(container_id=cid, resources=cpu_pin(*pin)))
        return updates

    @hookimpl
    def nri_synchronize(
        self, pods: list[Pod], containers: list[Container], saved_state: Any
    ) -> list[Update]:
        assert self.policy is not None and self.policy.config is not None
        wait = self._reply_path(reconfigures=True)
        self.policy.cpu_classes.pct.hold = False
        self.policy.set_config(self.policy.config, wait)
        alive = {c.id for c in containers}
        restored = self.policy.restore(saved_state, alive) if saved_state else set()
        by_id = {p.id: p for p in pods}
        for c in containers:
            if c.id in restored:
                continue
            pod = by_id.get(c.pod_sandbox_id) or Pod(id=c.pod_sandbox_id)
            try:
                self.policy.allocate(pod, c)
            except BalloonsError as exc:
                log.warning("allocating resources for Sync produced an error: %s", exc)
        self.commit(wait)
        return self._all_updates()

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult | None:
        assert self.policy is not None
        try:
            try:
                bln = self.policy.allocate(pod, container)
            except BalloonsError as exc:
                raise PolicyError(str(exc)) from None
            return self._create_result(pod, container, bln)
        finally:
            self._commit_after_reply()

    def _commit_after_reply(self) -> None:
        """:meth:`commit` the decision once its answer is out
        (:meth:`Host.after_reply`): the runtime creates the container while
        the helper works, and the container's StartContainer, when a helper
        is configured (:class:`StartAfterCommit`), is answered after it."""
        if self.host is None:
            self.commit(self._reply_path())
        else:
            self.host.after_reply(lambda: self.commit(self._reply_path()))

    def _create_result(
        self, pod: Pod, container: Container, bln: Balloon | None
    ) -> CreateResult | None:
        assert self.policy is not None
        config = self.policy.config
        if bln is None:
            # upstream gives every container its classes, managed by the policy or not
            res = Resources()
            if config is not None:
                res = rdtblockio.with_classes(res, config.spec.control, pod, container)
            return (
                None if res == Resources() else CreateResult(adjustment=Adjustment(resources=res))
            )
        updates = self._updates(skip=container.id)
        cpus, mems = self.pins[container.id]
        assert config is not None
        pin = rdtblockio.with_classes(cpu_pin(cpus, mems), config.spec.control, pod, container)
        adjustment = Adjustment(resources=pin)
        sc = scheduling.effective_class(config.spec.scheduling_classes, bln.bdef, pod, container)
        if sc is not None:
            scheduler, io_priority = scheduling.adjustments(sc)
            adjustment = Adjustment(
                resources=adjustment.resources, scheduler=scheduler, io_priority=io_priority
            )
            self._warn_scheduling_support()
        return CreateResult(adjustment=adjustment, updates=updates)

    def _warn_scheduling_support(self) -> None:
        if self.scheduling_warned or self.runtime_nri >= (0, 11):
            return
        self.scheduling_warned = True
        log.warning(
            "the runtime (NRI %s) cannot apply scheduling classes: the scheduler needs "
            "NRI v0.11+, I/O priority v0.10+; containers run with default scheduling",
            ".".join(map(str, self.runtime_nri)) or "unknown",
        )

    @hookimpl
    def nri_update_container(
        self, pod: Pod, container: Container, resources: Resources
    ) -> list[Update]:
        pin = self.pins.get(container.id)
        if pin is None:
            return []
        return [Update(container_id=container.id, resources=cpu_pin(*pin))]

    @hookimpl
    def nri_stop_container(self, pod: Pod, container: Container) -> list[Update]:
        assert self.policy is not None
        self.policy.release(container.id)
        try:
            self.pins.pop(container.id, None)
            return self._updates()
        finally:
            self._commit_after_reply()

    @hookimpl
    def nri_remove_container(self, pod: Pod, container: Container) -> None:
        assert self.policy is not None
        if container.id in self.policy.owner:
            self.policy.release(container.id)
            self.commit(self._reply_path())
            self.pins.pop(container.id, None)

    @hookimpl
    def policy_shutdown(self) -> None:
        if self.podres is not None:
            self.podres.stop()
        self._stop_background()
        if self.rediscovery is not None:
            self.rediscovery.cancel()
            self.rediscovery = None
        if self.probe is not None:
            self.probe.cancel()
        self.probe = None
        if self.policy is not None:
            self.policy.cpu_classes.close()
        self.frequencies.close()

    @hookimpl
    def policy_export_state(self) -> Any:
        return self.policy.export() if self.policy else None

    @hookimpl
    def policy_state_changes(self) -> StateChanges | None:
        return self.policy.state_changes() if self.policy else None

    @hookimpl
    def policy_extended_resources(self) -> dict[str, int | None] | None:
        if self.policy is None:
            return None
        return extended_resources(self.policy)

    @hookimpl
    def policy_topology_zones(self) -> list[Zone] | None:
        if self.policy is None:
            return None
        return zones(self.policy, lambda cid: self.pins.get(cid, ("", "")))

    # -- observability (nri_balloons.observe) -----------------------------------------

    @hookimpl
    def policy_before_scrape(self, path: str) -> Any:
        from nri_balloons import observe

        return observe.before_scrape(self.policy, self.frequencies, path)

    @hookimpl
    def policy_collect_metrics(self) -> Any:
        from nri_balloons import observe

        return observe.metrics(self.policy, self.frequencies)

    @hookimpl
    def policy_instrumentation(self) -> str | None:
        """The running configuration's ``instrumentation.httpEndpoint``."""
        if self.policy is None or self.policy.config is None:
            return None
        return asked_endpoint(self.policy.config.spec)

    @hookimpl
    def policy_inspect(self) -> Any:
        from nri_balloons import observe

        return observe.inspect(self.policy, self.frequencies)


class StartAfterCommit:
    """Subscribes to StartContainer while an SST helper is configured: the
    commit of a create runs after its answer (``after_reply``), before the
    stub reads the next request, so the runtime's StartContainer (sent
    before the container's process runs) is answered only once the helper
    programmed the container's CPUs, or the commit went to the background.
    Without a helper nothing is committed: no subscription, no extra call."""

    @hookimpl
    def nri_start_container(self, pod: Pod, container: Container) -> None:
        return None  # answered in its turn: the commit before it has ended


def _has_pin(container: Container, cpus: str, mems: str) -> bool:
    """The runtime reports ``container`` on ``cpus`` (and ``mems``, when the
    pin sets them) already."""
    cpu = container.resources.cpu if container.resources else None
    return cpu is not None and cpu.cpus == cpus and (not mems or cpu.mems == mems)


def plugin() -> Balloons:
    """Entry-point target."""
    return Balloons()


__all__ = ["Balloons", "cpuset", "plugin"]
