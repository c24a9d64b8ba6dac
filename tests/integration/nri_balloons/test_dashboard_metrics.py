"""Every metric name the chart's Grafana dashboard queries is one the plugin
exports: the balloons plugin and the SST helper (sim backend, the Xeon 6776P
model) as real processes, the spec's pods through the runtime simulator, and
``/metrics`` scraped over HTTP twice (the busy MHz need two readings). The
dashboard is read from the chart directory of this repository
(``charts/nri-resource-policy-balloons/dashboards/``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from test_busy_frequency import scrape, spec_node

_TESTS = str(Path(__file__).resolve().parents[2])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import _dashboard  # noqa: E402


def sample_names(text: str) -> set[str]:
    """Every series name of a scrape (a histogram's ``_bucket``, ``_sum``, ``_count``)."""
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


async def test_every_metric_a_panel_queries_is_exported() -> None:
    queries = _dashboard.queries(_dashboard.load())
    wanted = {(where, n) for where, q in queries for n in _dashboard.metric_names(q)}
    assert len({n for _, n in wanted}) >= 8, wanted  # the dashboard's panels were read
    async with spec_node() as (_n, port):
        await scrape(port)
        await asyncio.sleep(0.3)
        exported = sample_names(await scrape(port))
    missing = sorted((where, n) for where, n in wanted if n not in exported)
    assert not missing, f"queried but not exported: {missing}; exported: {sorted(exported)}"
