"""Who answers which hook: the active policy decides, observers are told.

pluggy calls the last registered plugin first and, for a ``firstresult``
hook, stops at its answer: an observer registered after the policy would
replace the policy's decision with its own (an empty ``CreateResult`` would
unpin a container). :class:`PolicyHooks` is the host's ``hook``: a decision
hook (:data:`~nri_framework.hookspecs.DECISION_HOOKS`) reaches the policy's
implementation alone; every other hook (the notifications, ``policy_start``,
``policy_collect_metrics``, ``policy_shutdown``) reaches every registered
plugin, as with ``PluginManager.hook``.

A decision hook is called on every NRI request (the decision, then
``policy_state_changes`` for the journal): when the policy has one plain
implementation of it (no wrapper) it is called directly, with what pluggy
would pass it and returning what pluggy would return, without pluggy's
per-call machinery (the subset caller filters the plugins anew on each call:
about 2 us a call, against 0.1). Anything else (a wrapper, hook-call
monitoring, a call without every argument of the spec) goes through pluggy.
"""

from __future__ import annotations

import logging
from typing import Any

import pluggy

from nri_framework.hookspecs import DECISION_HOOKS

log = logging.getLogger("nri_framework.host")


class DecisionCaller:
    """A decision hook's caller for the policy's one plain implementation:
    ``__call__`` calls it directly; everything else is the pluggy caller's."""

    __slots__ = ("_argnames", "_caller", "_exec", "_firstresult", "_function", "_pm", "_spec_args")

    def __init__(self, pm: pluggy.PluginManager, caller: pluggy.HookCaller) -> None:
        (impl,) = caller.get_hookimpls()
        self._pm = pm
        #: pluggy's call loop when built (monitoring, ``enable_tracing``, replaces it)
        self._exec = pm._inner_hookexec
        self._caller = caller
        self._function = impl.function
        self._argnames = impl.argnames
        spec = caller.spec
        self._spec_args = frozenset(spec.argnames if spec else ())
        self._firstresult = bool(spec and spec.opts.get("firstresult"))

    @staticmethod
    def fits(caller: pluggy.HookCaller) -> bool:
        """``caller`` has one implementation that pluggy would just call."""
        impls = caller.get_hookimpls()
        if len(impls) != 1 or caller.spec is None:
            return False
        impl = impls[0]
        return not (impl.hookwrapper or impl.wrapper or impl.kwargnames)

    def __call__(self, **kwargs: Any) -> Any:
        if self._pm._inner_hookexec is not self._exec or not kwargs.keys() >= self._spec_args:
            return self._caller(**kwargs)  # monitored, or pluggy's warning or error
        res = self._function(*[kwargs[name] for name in self._argnames])
        if self._firstresult:
            return res
        return [] if res is None else [res]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._caller, name)


class PolicyHooks:
    """``pm.hook``, with each decision hook limited to ``policy``.

    Built after every plugin is registered (the host registers them all at
    once); an observer's implementation of a decision hook is never called,
    and a warning at start says so.
    """

    def __init__(self, pm: pluggy.PluginManager, policy: object) -> None:
        self._relay = pm.hook
        others = [p for p in pm.get_plugins() if p is not policy]
        for plugin in others:
            for caller in pm.get_hookcallers(plugin) or ():
                if caller.name in DECISION_HOOKS:
                    log.warning(
                        "observer %s implements the decision hook %s: not called, "
                        "only the policy decides",
                        getattr(plugin, "__name__", type(plugin).__name__),
                        caller.name,
                    )
        self._decisions: dict[str, pluggy.HookCaller | DecisionCaller] = {}
        for name in DECISION_HOOKS:
            subset = pm.subset_hook_caller(name, others)
            fits = DecisionCaller.fits(subset)
            self._decisions[name] = DecisionCaller(pm, subset) if fits else subset

    def __getattr__(self, name: str) -> Any:
        caller = self._decisions.get(name)
        if caller is None:
            caller = getattr(self._relay, name)
        setattr(self, name, caller)  # the next lookup is the instance's attribute
        return caller
