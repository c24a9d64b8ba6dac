"""nri_framework: the microkernel of nri-resource-policy.

NRI protocol stack (sans-IO codecs in :mod:`nri_framework.nri`, an asyncio
transport and plugin stub), the policy host, the typed domain model, the
runtime simulator and the command line.
"""

__version__ = "0.1.0"
