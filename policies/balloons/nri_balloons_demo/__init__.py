"""The demos: a simulated node, the plugin, pods, and checks of what happens.

``nri-resource-policy demo [NAME]`` (:mod:`.harness`) runs the demos found
through the ``nri_resource_policy.demos`` entry points:

* ``pct-managed`` (:mod:`.pct_managed`, the default): the spec's Priority Core
  Turbo walkthrough on a simulated dual-socket Xeon 6776P, one function per
  spec step;
* ``pct-assoc-only`` (:mod:`.pct_assoc_only`): reference §19's manual example,
  the operator owns SST;
* ``balloons`` (:mod:`.balloons`): the spec's balloon types without PCT;
* ``pinner`` (:mod:`.pinner`): the framework's foundation policy.

:mod:`.node` builds the simulated node (sysfs tree, SST helper, runtime
simulator, plugin process), :mod:`.sstmodel` reads and writes the helper's
SST model directly, :mod:`.tables` prints the spec's tables, :mod:`.checks`
counts the checks. This package is test harness: it runs the runtime
simulator and the helper's server side, so neither the plugin package
(``nri_balloons``) nor the plugin image carries it.
"""
