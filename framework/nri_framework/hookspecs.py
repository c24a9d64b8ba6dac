"""The whole contract between the host and a policy.

A policy is a module (or object) with functions marked ``@hookimpl`` whose
names are the hooks below. It is found through the entry-point group
``nri_resource_policy.policies``; ``nri-resource-policy run --policy NAME``
loads the entry point ``NAME`` and registers it with the host's
:class:`pluggy.PluginManager`.

Rules that hold for every hook:

* Hooks are synchronous and run on the NRI event loop, one at a time: a hook
  is never re-entered while another runs, so a policy needs no locks. They
  must be quick: the runtime waits for the answer (2 s at most, then it drops
  the plugin). No Kubernetes or sysfs I/O belongs here.
* Arguments are :mod:`nri_framework.model` Structs, never protobuf. The host
  owns them; a policy must not keep references to ``pod``/``container``
  beyond the call, and cannot mutate them (the Structs are frozen).
* An exception raised by a decision hook becomes an error status on the NRI
  request. For CreateContainer this fails the container's creation with the
  exception's text, which the runtime reports to the kubelet; raise
  :class:`PolicyError` with a message an operator can act on.
* Only the active policy decides. Other registered plugins (observers) get
  the notification hooks; the host calls a decision hook (see
  :data:`DECISION_HOOKS`: every ``firstresult`` hook, and the requests whose
  answer is the policy's acceptance) on the policy's implementation alone, so
  an observer's answer can neither replace nor refuse the policy's.
* The subscription to runtime events is derived from which ``nri_*`` hooks
  the policy implements, and which notification hooks any registered plugin
  implements (see :data:`EVENT_HOOKS`), capped by what the runtime's NRI
  version accepts.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

import pluggy

from nri_framework.model import Event

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Mapping

    from nri_framework.contract import Host, MetricFamily, Peer
    from nri_framework.journal import StateChanges
    from nri_framework.model import (
        Container,
        CreateResult,
        Pod,
        Resources,
        RuntimeInfo,
        Update,
    )
    from nri_framework.zones import Zone

PROJECT = "nri_resource_policy"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class PolicyError(Exception):
    """A decision the policy cannot make; its text goes back to the runtime."""


# --- lifecycle of the policy ------------------------------------------------


@hookspec
def policy_addoption(parser: argparse.ArgumentParser) -> None:
    """Add the policy's own flags to ``nri-resource-policy run``.

    Called once per process, before the command line is parsed and before
    the host exists (no other hook has run): ``run --policy NAME`` reads
    ``--policy`` alone first, loads the policy ``NAME``, calls this hook,
    then parses the whole command line, so ``run --policy NAME --help``
    lists the policy's flags too. Like pytest's ``pytest_addoption``.

    :param parser: the ``run`` subcommand's :class:`argparse.ArgumentParser`,
        already holding the framework's flags (``--host-root``,
        ``--config-file``, ...). Add only the policy's own flags, in an
        argument group named after the policy::

            group = parser.add_argument_group("balloons")
            group.add_argument("--sst-helper", default="", help="...")

    A flag that is already there cannot be added again (``run`` exits with
    status 2 saying which). The parsed values reach the policy in
    :func:`policy_start` as ``host.options``, an :class:`argparse.Namespace`
    of every flag (a host built without a command line has only what its
    caller gave); :func:`nri_framework.cmdline.typed_options` makes the
    policy's own typed options of it.
    """


@hookspec(firstresult=True)
def policy_peer() -> Peer | None:
    """The process the policy works with but does not wait for (balloons: the
    SST helper), as a :class:`~nri_framework.contract.Peer`.

    Stops at the first non-None result: that peer is the one watched.

    Called once, after :func:`policy_start`, when ``run`` serves: the host
    looks for the peer until it is reachable (then now and again) and
    ``/healthz`` fails while it is not. ``None``: the policy has no peer.
    """


@hookspec
def policy_start(host: Host) -> None:
    """Called once, after registration with the host and before any NRI traffic.

    :param host: the host's services for this policy: command-line options
        (``host.options``), the state directory, the host root to read sysfs
        from, a logger, the pod/container cache, and
        :meth:`~nri_framework.contract.Host.update_containers` to push
        unsolicited updates to the runtime.

    Read the hardware topology here, not in event hooks.
    """


@hookspec(firstresult=True)
def policy_export_state() -> Any:
    """Return the policy's state to persist, or ``None``.

    Stops at the first non-None result: the state to persist (``None``: the
    policy keeps none).

    Called after every change the host has applied, before the reply that
    announces it leaves (the host journals it: see :mod:`nri_framework.journal`),
    so keep it cheap; or, for a policy with keyed state
    (:func:`policy_state_changes`), only for the snapshot, off the reply
    path, and for the first record of a process. The value must be
    serializable by msgspec (Structs, dicts, lists, strings, numbers). It is
    handed back, decoded as plain
    builtins, through the ``saved_state`` argument of :func:`nri_synchronize`
    after a restart.
    """


@hookspec(firstresult=True)
def policy_state_changes() -> StateChanges | None:
    """What changed in the policy's keyed state since the last call, or ``None``.

    Stops at the first non-None result: the policy's state is keyed (``None``:
    it is not, and each record holds the whole :func:`policy_export_state`
    when it changed).

    A policy whose state is a dict of parts (``policy_export_state`` returns
    ``{key: part}``, every part serializable by msgspec) implements it to
    make each decision's journal record hold what the decision changed, not
    the whole state: return the parts changed since the previous call by key
    (``None``: the part is gone), as
    :class:`~nri_framework.journal.StateChanges`, and forget them; set
    ``reset`` when the whole state was replaced (the host then journals the
    whole :func:`policy_export_state`, as it also does on the first record of
    a process). Called after every change the host has applied, before the
    reply that announces it leaves, right before the record is written: keep
    it proportional to the change. After a restart the merged parts come back,
    as one dict, through the ``saved_state`` argument of :func:`nri_synchronize`.
    """


@hookspec(firstresult=True)
def policy_prepare_config(config: str, source: str) -> Any:
    """Parse and check a new configuration, before :func:`policy_reconfigure`.

    The exception to the rules above: called in a worker thread of the host,
    off the event loop, while NRI requests go on being answered, so that a
    huge or slow text delays no reply. It must not change the policy's state
    or touch anything the event hooks use; it may read what
    :func:`policy_start` set up. The host gives up waiting after
    ``PREPARE_TIMEOUT`` seconds; bound your own parsing in time too (the
    thread cannot be stopped).

    :param config: the configuration text.
    :param source: where it came from, for messages.

    Stops at the first non-None result: what :func:`policy_reconfigure` gets
    as ``prepared``. Raise :class:`PolicyError` to reject the text.
    """


@hookspec(firstresult=True)
def policy_reconfigure(config: str, source: str, prepared: Any) -> list[Update] | None:
    """A new configuration for the running policy (a reloaded ``--config-file``,
    or a custom resource the agent delivers).

    :param config: the configuration text.
    :param source: where it came from, for messages.
    :param prepared: what :func:`policy_prepare_config` returned for this text
        (``None`` when no plugin implements it: parse ``config`` here then).

    Raise :class:`PolicyError` to reject it: the running configuration must
    stay in force. Stops at the first non-None result: the updates of the
    containers that moved, which the host pushes to the runtime with
    UpdateContainers (``None``: nothing moved).
    """


@hookspec(firstresult=True)
def policy_topology_zones() -> list[Zone] | None:
    """The NodeResourceTopology zones describing the policy's current placement.

    Called by the agent after changes (off the reply path). Stops at the
    first non-None result: the zones to publish (``None``: the policy
    publishes no zones).
    """


@hookspec(firstresult=True)
def policy_extended_resources() -> dict[str, int | None] | None:
    """The node extended resources the policy wants published (reference
    §13.5): the *complete* desired map. A non-``None`` value publishes that
    count under the key; ``None`` under an exact key removes it; ``None`` under
    a key ending in ``/*`` claims ownership of that domain (every matching key
    not published is removed). Only names matching ``*.nri.io/*`` are touched.

    Called by the agent after changes (off the reply path). Stops at the
    first non-None result: the desired map (``None``: the policy has no
    opinion).
    """


@hookspec(firstresult=True)
def policy_instrumentation() -> str | None:
    """Where the policy's configuration asks the instrumentation endpoint
    (``/healthz``, ``/livez``, ``/metrics``, ``/debug/state``) to serve:
    ``HOST:PORT``, ``:PORT`` (every interface) or ``[V6]:PORT``, as
    :func:`nri_framework.instrumentation.parse_address` reads it (balloons:
    ``instrumentation.httpEndpoint``). Check the address when the
    configuration is validated: an invalid one never gets here.

    Called after :func:`policy_start` and after every change the host applies
    (a (re)configuration among them), on the event loop: return the running
    configuration's value, no work. A changed answer moves the endpoint (the
    new address bound first, then the old one closed; an address that cannot be
    bound is logged and the old one keeps serving); ``""`` stops serving.
    ``nri-resource-policy run --metrics-address`` overrides the answer (an info
    line says so). Stops at the first non-None result (``None``: no opinion,
    the endpoint stays as it is).
    """


@hookspec
def policy_collect_metrics() -> list[MetricFamily] | None:
    """The policy's metrics, on every scrape of ``/metrics``.

    Called on the NRI event loop between requests (never during one), so it
    reads the policy's state without locks; keep it cheap (no I/O). Return
    plain data: :class:`~nri_framework.contract.MetricFamily` values,
    each exported as ``nri_policy_<name>_<unit>`` (the host owns
    ``prometheus_client``). Every implementation is called; ``None`` or
    ``[]`` contributes nothing. A family whose samples come and go (one per
    balloon) is simply built anew on each call.
    """


@hookspec
def policy_before_scrape(path: str) -> Awaitable[None] | None:
    """A request of ``path`` (``/metrics`` or ``/debug/state``) is about to
    call :func:`policy_collect_metrics` or :func:`policy_inspect`.

    Return an awaitable that reads what the scrape shows from a peer (one
    reading per scrape, such as the SST helper's frequency counters), or
    ``None``. The host awaits every one together on the event loop (NRI
    requests are served meanwhile), at most
    :data:`~nri_framework.instrumentation.SCRAPE_WAIT` seconds, then cancels
    what is left and answers with what the policy has; a failing awaitable is
    logged. Every implementation is called.
    """


@hookspec(firstresult=True)
def policy_inspect() -> dict[str, Any] | None:
    """The policy's state for ``/debug/state`` and ``nri-resource-policy inspect``.

    Called like :func:`policy_collect_metrics`. Return a JSON-able dict
    (strings, numbers, booleans, ``None``, lists, dicts). ``inspect`` prints
    every value that is a list of dicts as a table titled by its key (columns:
    the keys of the rows, scalars first, in order of first appearance), and a
    ``containers`` dict ``{container id: {column: value}}`` as extra columns of
    its container table. A ``cpu_map`` dict shaped as
    :class:`nri_framework.cpumap.CpuMap` (the topology's skeleton, what each
    CPU shows, a legend) is what ``inspect --map`` draws. Stops at the first
    non-None result: that dict (``None``: the policy has nothing to show).
    """


@hookspec
def policy_shutdown() -> None:
    """The host is stopping (SIGTERM/SIGINT). Release what the policy holds."""


# --- NRI requests that expect a decision ------------------------------------


@hookspec
def nri_configure(config: str, runtime: RuntimeInfo) -> None:
    """The runtime's Configure request.

    Not ``firstresult``: no result is meant, the reply (the event
    subscription) is the host's. Returning accepts; a decision hook all the
    same, called on the policy alone.

    :param config: configuration text the runtime has for this plugin (only
        pre-launched plugins get one; ``""`` otherwise).
    :param runtime: runtime name, version and, when known, its NRI version
        and timeouts.

    Raise :class:`PolicyError` to refuse the configuration (registration
    then fails).
    """


@hookspec(firstresult=True)
def nri_synchronize(
    pods: list[Pod], containers: list[Container], saved_state: Any
) -> list[Update] | None:
    """Every pod and container that exists in the runtime, once after Configure.

    :param pods: all pod sandboxes.
    :param containers: all containers, with their current resources (cpusets
        reflect earlier adjustments).
    :param saved_state: what :func:`policy_export_state` returned before a
        restart of this plugin, decoded as builtins, or ``None``.

    Stops at the first non-None result: the updates for existing containers
    (for example to re-assert pinning; ``None``: none). After a restart, a
    policy should keep every running container on the CPUs it already has.
    """


@hookspec(firstresult=True)
def nri_create_container(pod: Pod, container: Container) -> CreateResult | None:
    """A container is being created: decide where it runs.

    Stops at the first non-None result: the adjustment for the new container
    plus updates to other containers (for example a shrunk shared pool);
    ``None`` leaves the container as the runtime made it.
    """


@hookspec(firstresult=True)
def nri_update_container(
    pod: Pod, container: Container, resources: Resources
) -> list[Update] | None:
    """The kubelet changes a container's resources (UpdateContainerResources).

    :param resources: the new resources the kubelet asked for.

    Stops at the first non-None result: the updates to send back (``None``:
    none, the kubelet's resources apply). An update returned for this same
    container *replaces* the kubelet's: a pinning policy must re-assert
    ``cpus``/``mems`` here, or the kubelet's cpuset wins.
    """


@hookspec(firstresult=True)
def nri_stop_container(pod: Pod, container: Container) -> list[Update] | None:
    """A container stopped; release its resources.

    Stops at the first non-None result: the updates for other containers
    (``None``: none).
    """


@hookspec
def nri_update_pod_sandbox(pod: Pod, resources: Resources) -> None:
    """A pod's resources change (NRI v0.10+ runtimes only).

    Not ``firstresult``: no result is meant (NRI's reply is empty). Returning
    accepts; a decision hook all the same, called on the policy alone.
    """


# --- NRI notifications (no answer; every implementation is called) ----------


@hookspec
def nri_run_pod_sandbox(pod: Pod) -> None:
    """A pod sandbox started."""


@hookspec
def nri_stop_pod_sandbox(pod: Pod) -> None:
    """A pod sandbox stopped."""


@hookspec
def nri_remove_pod_sandbox(pod: Pod) -> None:
    """A pod sandbox was removed; the host drops it from its cache after this."""


@hookspec
def nri_post_create_container(pod: Pod, container: Container) -> None:
    """A container was created (with the merged adjustments of all plugins)."""


@hookspec
def nri_start_container(pod: Pod, container: Container) -> None:
    """A container is starting."""


@hookspec
def nri_post_start_container(pod: Pod, container: Container) -> None:
    """A container started; ``container.pid`` is set."""


@hookspec
def nri_post_update_container(pod: Pod, container: Container) -> None:
    """A container's resources were updated."""


@hookspec
def nri_remove_container(pod: Pod, container: Container) -> None:
    """A container was removed; the host drops it from its cache after this."""


#: Hooks whose answer the host turns into a reply or a decision: the policy's
#: alone. Every ``firstresult`` hook, and the requests the policy accepts by
#: returning or refuses by raising.
DECISION_HOOKS: frozenset[str] = frozenset(
    {
        "policy_export_state",
        "policy_state_changes",
        "policy_prepare_config",
        "policy_reconfigure",
        "policy_topology_zones",
        "policy_extended_resources",
        "policy_inspect",
        "policy_instrumentation",
        "policy_peer",
        "nri_configure",
        "nri_synchronize",
        "nri_create_container",
        "nri_update_container",
        "nri_stop_container",
        "nri_update_pod_sandbox",
    }
)

#: Hook name -> the NRI event whose subscription it needs.
EVENT_HOOKS: dict[str, Event] = {
    "nri_run_pod_sandbox": Event.RUN_POD_SANDBOX,
    "nri_stop_pod_sandbox": Event.STOP_POD_SANDBOX,
    "nri_remove_pod_sandbox": Event.REMOVE_POD_SANDBOX,
    "nri_create_container": Event.CREATE_CONTAINER,
    "nri_post_create_container": Event.POST_CREATE_CONTAINER,
    "nri_start_container": Event.START_CONTAINER,
    "nri_post_start_container": Event.POST_START_CONTAINER,
    "nri_update_container": Event.UPDATE_CONTAINER,
    "nri_post_update_container": Event.POST_UPDATE_CONTAINER,
    "nri_stop_container": Event.STOP_CONTAINER,
    "nri_remove_container": Event.REMOVE_CONTAINER,
    "nri_update_pod_sandbox": Event.UPDATE_POD_SANDBOX,
}

#: every hook's name (the functions above marked ``@hookspec``)
HOOK_NAMES: frozenset[str] = frozenset(
    name for name, value in list(globals().items()) if hasattr(value, f"{PROJECT}_spec")
)


def _marked(plugin: object, name: str) -> bool:
    """``plugin``'s attribute ``name`` is marked ``@hookimpl`` (looked up in
    the module's, the object's and its classes' dicts, no descriptor run)."""
    where: list[Mapping[str, object]] = [getattr(plugin, "__dict__", {})]
    if not isinstance(plugin, types.ModuleType):
        where += [k.__dict__ for k in type(plugin).__mro__]
    for space in where:
        if name in space:
            value = space[name]
            return hasattr(getattr(value, "__func__", value), f"{PROJECT}_impl")
    return False


class _Manager(pluggy.PluginManager):
    """pluggy's manager, reading only the attributes of a plugin that are
    named as a hook or marked ``@hookimpl`` (one named otherwise, with
    ``specname``): ``register`` asks :meth:`parse_hookimpl_opts` (pluggy's
    documented override point) about every name in ``dir(plugin)``, and its
    answer reads each attribute with ``inspect.getattr_static``, about 0.7 ms
    of each start for the balloons policy's methods."""

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        if name not in HOOK_NAMES and not _marked(plugin, name):
            return None
        return super().parse_hookimpl_opts(plugin, name)


def plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with these hooks (the host's, the command line's)."""
    pm = _Manager(PROJECT)
    pm.add_hookspecs(sys.modules[__name__])
    return pm
