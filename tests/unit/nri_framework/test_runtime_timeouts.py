"""The runtime's timeouts (ConfigureRequest fields 4 and 5, NRI 0.7+): read, bounded,
logged once at Configure and used for the reply path's budget (:meth:`reply_budget`)."""

from __future__ import annotations

import logging

import pytest
from nri_framework.hookspecs import hookimpl
from nri_framework.host import REPLY_SHARE, PolicyHost
from nri_framework.model import Container, Pod, RuntimeInfo

#: what containerd 1.7.24 (NRI 0.6.1) sends: no timeouts
CONTAINERD_17 = RuntimeInfo(name="containerd", version="1.7.24~ds1")


def containerd_21(request_ms: int, registration_ms: int = 5000) -> RuntimeInfo:
    return RuntimeInfo(
        name="containerd",
        version="2.1.9+unknown",
        registration_timeout_ms=registration_ms,
        request_timeout_ms=request_ms,
    )


class OnlyCreate:
    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> None:
        return None


def test_defaults_when_the_runtime_sends_none() -> None:
    assert not CONTAINERD_17.sent_timeouts
    assert (CONTAINERD_17.request_timeout, CONTAINERD_17.registration_timeout) == (2.0, 5.0)


def test_the_runtimes_word_is_bounded() -> None:
    hostile = containerd_21(2**62, -5)
    assert hostile.request_timeout == 600.0
    assert hostile.registration_timeout == 5.0  # nonsense: the default


@pytest.mark.parametrize(
    ("runtime", "budget"),
    [
        (CONTAINERD_17, 0.05),  # 2 s default: the policy's own 50 ms stand
        (containerd_21(2000), 0.05),
        (containerd_21(100), 0.025),  # a short plugin_request_timeout caps it
        (containerd_21(40), 0.01),
    ],
)
def test_reply_budget_is_a_share_of_the_request_timeout(
    runtime: RuntimeInfo, budget: float
) -> None:
    host = PolicyHost("t", OnlyCreate())
    host.configure("", runtime)
    assert host.reply_budget(0.05) == pytest.approx(budget)
    assert host.reply_budget(0.05) <= REPLY_SHARE * runtime.request_timeout


def test_configure_logs_the_timeouts_once(caplog: pytest.LogCaptureFixture) -> None:
    host = PolicyHost("t", OnlyCreate())
    with caplog.at_level(logging.INFO, "nri_framework.host"):
        host.configure("", containerd_21(300, 3000))
        host.configure("", CONTAINERD_17)
    lines = [r.getMessage() for r in caplog.records if "timeout" in r.getMessage()]
    assert lines == [
        "runtime timeouts: registration 3000 ms, request 300 ms; "
        "a reply's blocking work is capped at 75 ms",
        "runtime containerd 1.7.24~ds1 sent no timeouts (NRI < 0.7): assuming NRI's "
        "defaults, registration 5000 ms, request 2000 ms",
    ]
