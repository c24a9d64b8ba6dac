"""The hook contract itself: what ``hookspecs`` depends on at run time."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from nri_framework import hookspecs


def test_hookspecs_imports_no_part_of_the_host() -> None:
    """The contract names the host, its metrics and the stub only under
    ``TYPE_CHECKING``: importing it loads none of them (a fresh interpreter,
    so that no other test's imports count)."""
    code = (
        "import json, sys\n"
        "import nri_framework.hookspecs\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('nri_framework'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded = set(json.loads(out))
    assert "nri_framework.hookspecs" in loaded
    for module in ("host", "instrumentation", "stub", "contract"):
        assert f"nri_framework.{module}" not in loaded, module


def specs() -> dict[str, dict[str, Any]]:
    """Hook name -> its ``@hookspec`` options."""
    marker = f"{hookspecs.PROJECT}_spec"
    return {
        name: getattr(fn, marker)
        for name, fn in vars(hookspecs).items()
        if callable(fn) and hasattr(fn, marker)
    }


def test_every_firstresult_hook_is_a_decision_hook() -> None:
    """Only the policy answers a ``firstresult`` hook: pluggy would otherwise
    take the last registered observer's answer."""
    all_specs = specs()
    firstresult = {name for name, opts in all_specs.items() if opts.get("firstresult")}
    assert firstresult <= hookspecs.DECISION_HOOKS
    assert set(all_specs) >= hookspecs.DECISION_HOOKS
    for name in firstresult:
        doc = getattr(hookspecs, name).__doc__
        assert "Stops at the first non-None result" in " ".join(doc.split()), name


@hookspecs.hookimpl(specname="nri_post_start_container")
def _started(pod: object, container: object) -> None:
    """A module's hook (this module, registered as a plugin), by ``specname``."""
    return None


class _Plugin:
    """Hooks as policies write them: by name, by ``specname``, static, and
    attributes that are no hook (a method, a property, a plain value)."""

    limit = 3

    @hookspecs.hookimpl
    def nri_create_container(self, pod: object, container: object) -> None:
        return None

    @hookspecs.hookimpl(specname="nri_stop_container")
    def on_stop(self, pod: object, container: object) -> None:
        return None

    @staticmethod
    @hookspecs.hookimpl
    def policy_shutdown() -> None:
        return None

    def helper(self) -> int:
        return 1

    @property
    def config(self) -> int:
        raise AssertionError("registration ran a property")


def _impls(pm: Any) -> dict[str, list[str]]:
    return {
        name: sorted(i.function.__name__ for i in caller.get_hookimpls())
        for name, caller in vars(pm.hook).items()
        if caller.get_hookimpls()
    }


def test_the_plugin_manager_finds_the_hooks_pluggy_finds() -> None:
    """Every hook of a plugin object, of a module and of the balloons policy,
    as pluggy's own manager finds them (``specname`` included)."""
    import pluggy
    from nri_balloons.plugin import Balloons

    for plugin in (_Plugin(), sys.modules[__name__], Balloons()):
        ours = hookspecs.plugin_manager()
        theirs = pluggy.PluginManager(hookspecs.PROJECT)
        theirs.add_hookspecs(hookspecs)
        ours.register(plugin)
        theirs.register(plugin)
        assert _impls(ours) == _impls(theirs), plugin
        assert _impls(ours), plugin
    pm = hookspecs.plugin_manager()
    pm.register(_Plugin())
    assert _impls(pm) == {
        "nri_create_container": ["nri_create_container"],
        "nri_stop_container": ["on_stop"],
        "policy_shutdown": ["policy_shutdown"],
    }


def test_registration_reads_only_hook_attributes(monkeypatch: Any) -> None:
    """pluggy's attribute reading (its ``parse_hookimpl_opts``, a static
    lookup per name) runs for the names of hooks and ``@hookimpl`` methods
    alone, not for every name of the plugin: that reading was 0.7 ms of each
    start for the balloons policy."""
    import pluggy

    asked: list[str] = []
    parse = pluggy.PluginManager.parse_hookimpl_opts

    def counted(self: Any, plugin: object, name: str) -> Any:
        asked.append(name)
        return parse(self, plugin, name)

    monkeypatch.setattr(pluggy.PluginManager, "parse_hookimpl_opts", counted)
    hookspecs.plugin_manager().register(_Plugin())
    assert sorted(asked) == ["nri_create_container", "on_stop", "policy_shutdown"]


def test_hook_names_are_the_specs() -> None:
    assert set(specs()) == hookspecs.HOOK_NAMES
