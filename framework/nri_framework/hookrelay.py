"""Who answers which hook: the active policy decides, observers are told.

pluggy calls the last registered plugin first and, for a ``firstresult``
hook, stops at its answer: an observer registered after the policy would
replace the policy's decision with its own (an empty ``CreateResult`` would
unpin a container). :class:`PolicyHooks` is the host's ``hook``: a decision
hook (:data:`~nri_framework.hookspecs.DECISION_HOOKS`) reaches the policy's
implementation alone; every other hook (the notifications, ``policy_start``,
``policy_collect_metrics``, ``policy_shutdown``) reaches every registered
plugin, as with ``PluginManager.hook``.
"""

from __future__ import annotations

import logging

import pluggy

from nri_framework.hookspecs import DECISION_HOOKS

log = logging.getLogger("nri_framework.host")


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
        self._decisions: dict[str, pluggy.HookCaller] = {
            name: pm.subset_hook_caller(name, others) for name in DECISION_HOOKS
        }

    def __getattr__(self, name: str) -> pluggy.HookCaller:
        caller = self._decisions.get(name)
        if caller is not None:
            return caller
        hook: pluggy.HookCaller = getattr(self._relay, name)
        return hook
