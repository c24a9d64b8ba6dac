"""The configuration's ``instrumentation.httpEndpoint`` (reference §2.1; the
chart's ``:8891``): where the plugin's instrumentation endpoint serves
(``/healthz``, ``/livez``, ``/metrics``, ``/debug/state``).

Checked when the configuration is validated (an invalid address rejects the
configuration, and the running one, endpoint included, stays); handed to the
host through ``policy_instrumentation``, which moves the endpoint when it
changes. ``run --metrics-address`` overrides it. Upstream's other
``instrumentation`` fields (tracing, exporters) are parsed and unused.
"""

from __future__ import annotations

from nri_framework.instrumentation import AddressError, parse_address

from nri_balloons.config import BalloonsPolicySpec

FIELD = "instrumentation.httpEndpoint"


def endpoint_errors(spec: BalloonsPolicySpec, prefix: str = "") -> list[str]:
    """The error of an ``httpEndpoint`` that is not an address, or none."""
    address = spec.instrumentation.http_endpoint
    if not address:
        return []
    try:
        parse_address(address)
    except AddressError as exc:
        return [f"{prefix}{FIELD}: {exc}"]
    return []


def asked_endpoint(spec: BalloonsPolicySpec) -> str:
    """Where the configuration asks the endpoint to serve (``""``: nowhere)."""
    return spec.instrumentation.http_endpoint.strip()
