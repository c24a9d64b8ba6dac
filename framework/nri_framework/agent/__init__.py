"""The Kubernetes agent (``nri-resource-policy run --config-namespace``).

* :mod:`~nri_framework.agent.config`: the configuration source (BalloonsPolicy
  custom resources, node > group > default) and per-node status;
* :mod:`~nri_framework.agent.nrt`: the NodeResourceTopology publisher;
* :mod:`~nri_framework.agent.extres`: node extended resources;
* :mod:`~nri_framework.agent.kube`: the blocking Kubernetes I/O (the only
  importer of the ``kubernetes`` client);
* :mod:`~nri_framework.agent.agent`: :class:`Agent` ties them to the plugin host;
* :mod:`~nri_framework.agent.options`: whether ``run`` talks to a cluster.

Nothing is imported here: ``run`` without a cluster does not pay for the client.
"""
