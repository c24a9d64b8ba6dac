"""The agent's options, and whether ``run`` talks to a cluster at all.

Light on purpose (no Kubernetes client import): ``run`` reads it every time.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping

import msgspec

log = logging.getLogger("nri_framework.agent")

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_GROUP_LABEL = "config.nri/group"
#: Seconds between resyncs of the extended resources (jittered per node), and to the
#: first retry after a failure (the delay grows after more).
RESYNC = 300.0
RETRY = 5.0


class AgentOptions(msgspec.Struct, frozen=True):
    node: str
    namespace: str
    group_label: str = DEFAULT_GROUP_LABEL
    kubeconfig: str = ""
    resync: float = RESYNC
    retry: float = RETRY


def agent_options(
    *,
    config_file: str,
    namespace: str,
    group_label: str,
    kubeconfig: str,
    environ: Mapping[str, str],
) -> AgentOptions | None:
    """Whether ``run`` talks to a cluster, and how.

    ``--config-file`` wins and means no cluster access at all (upstream).
    Otherwise the agent runs when ``--config-namespace`` is given, or in a pod
    (``KUBERNETES_SERVICE_HOST`` set: namespace ``kube-system``, upstream's
    default). The node is ``$NODE_NAME`` (the chart sets it from
    ``spec.nodeName``), else the host name.
    """
    if config_file:
        if namespace:
            log.warning(
                "--config-file %s is given: --config-namespace %s is ignored "
                "(no cluster access with a local configuration)",
                config_file,
                namespace,
            )
        return None
    if not namespace and not environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    node = environ.get("NODE_NAME", "")
    if not node:
        node = socket.gethostname()
        log.warning("NODE_NAME is not set: using the host name %s as the node name", node)
    return AgentOptions(
        node=node,
        namespace=namespace or DEFAULT_NAMESPACE,
        group_label=group_label or DEFAULT_GROUP_LABEL,
        kubeconfig=kubeconfig,
    )
