"""Upstream e2e balloons/n4c16/test02-prometheus-metrics: the
``nri_policy_balloons_cores`` line format with the full label set, balloons
appearing and disappearing, inflate/deflate values, instance index reuse
(``fast-dualcore[0]`` recreated) and the hideHyperthreads annotation.

The plugin serves ``/metrics`` on a free loopback port (``--metrics-address``
instead of the config's ``instrumentation.httpEndpoint: :8891``); each
``verify-metrics-has-line``/``-has-no-line`` is a regular expression searched
in the lines of one scrape, as upstream's helpers do."""

from __future__ import annotations

import re

from balloons_e2e import Node, http_get, node

TEST = "test02-prometheus-metrics"
_LISTENING = re.compile(r"instrumentation HTTP endpoint listening on (\S+):(\d+) ")


async def metrics(n: Node) -> list[str]:
    m = next(m for line in n.plugin.tail if (m := _LISTENING.search(line)))
    status, text = await http_get(int(m.group(2)), "/metrics")
    assert status == 200, text
    return text.splitlines()


async def has_line(n: Node, pattern: str) -> None:
    lines = await metrics(n)
    assert any(re.search(pattern, line) for line in lines), (
        f"no metrics line matches {pattern!r}:\n"
        + "\n".join(x for x in lines if "balloons_cores{" in x)
    )


async def has_no_line(n: Node, pattern: str) -> None:
    lines = await metrics(n)
    found = [line for line in lines if re.search(pattern, line)]
    assert not found, f"metrics lines match {pattern!r}:\n" + "\n".join(found)


async def test_prometheus_metrics() -> None:
    async with node(TEST, "balloons.yaml", args=("--metrics-address", "127.0.0.1:0")) as n:
        await n.plugin.wait_output("instrumentation HTTP endpoint listening on", timeout=10)
        await has_line(n, r'balloon="default\[0\]"')
        await has_line(n, r'balloon="reserved\[0\]"')
        await has_no_line(n, r'balloon="full-core\[0\]"')
        await has_no_line(n, r'balloon_type="full-core"')
        await has_no_line(n, r'balloon_type="fast-dualcore"')
        await has_no_line(n, r'balloon_type="flex"')

        # pod0 in full-core[0]
        await n.create("pod0.yaml")
        await has_line(n, r'balloon="default\[0\]"')
        await has_line(n, r'balloon="reserved\[0\]"')
        await has_line(
            n,
            r'nri_policy_balloons_cores\{balloon="full-core\[0\]",balloon_type="full-core",'
            r'containers="default/pod0/pod0c0,default/pod0/pod0c1",cpu_class="normal",'
            r'cpus=".*",cpus_allowed=".*",cpus_allowed_count="2",cpus_count="2",cpus_max="2",'
            r'cpus_min="2",dies="p[01]d[01]",dies_count="1",groups="",mems="[0-3]",'
            r'numas="p[01]d[01]n[0-3]",numas_count="1",packages="p[01]",packages_count="1",'
            r'sharedidlecpus="",sharedidlecpus_count="0",tot_req_millicpu="(199|200)"\} 2',
        )
        assert len(n.cpus("pod0c0")) == 1
        assert len(n.cpus("pod0c1")) == 2
        assert n.cpus("pod0c0") <= n.cpus("pod0c1")

        # pod1 in fast-dualcore[0]
        await n.create("pod1.yaml")
        await has_line(n, r'balloon="fast-dualcore\[0\]".*tot_req_millicpu="(199|200)".* 4')
        await has_no_line(n, r'balloon="fast-dualcore\[1\]"')

        # pod2 in fast-dualcore[1] (FillChain prefers new-balloon)
        await n.create("pod2.yaml")
        await has_line(n, r'balloon="fast-dualcore\[0\]"')
        await has_line(n, r'balloon="fast-dualcore\[1\]".*tot_req_millicpu="500".* 4')
        await has_no_line(n, r'balloon_type="flex"')

        # pod3 in flex[0]
        await n.create("pod3.yaml")
        await has_line(n, r'balloon_type="flex".* 4')

        # pod4 in flex[0], balloon inflated to fit pod3 + pod4
        await n.create("pod4.yaml")
        await has_line(n, r'balloon_type="flex"')
        await has_line(n, r'balloon_type="flex".* 5')

        # check deflating a balloon in metrics
        await n.delete("pod3")
        await has_line(n, r'balloon_type="flex"')
        await has_line(n, r'balloon_type="flex".* 2')

        # check popping a balloon from metrics
        await n.delete("pod4")
        await has_no_line(n, r'balloon_type="flex"')

        # pop fast-dualcore[0], keep fast-dualcore[1]
        await n.delete("pod1")
        await has_line(n, r'balloon="fast-dualcore\[1\]"')
        await has_no_line(n, r'balloon="fast-dualcore\[0\]"')

        # re-create balloon instance fast-dualcore[0] that was just popped.
        # pod5 in fast-dualcore[0], pod2 keeps running in fast-dualcore[1]
        await n.create("pod5.yaml")
        await has_line(n, r'balloon="fast-dualcore\[1\]".*pod2c0.* 4')
        await has_line(n, r'balloon="fast-dualcore\[0\]".*pod5c0.* 4')
