"""Watch responses as the API server streams them: one JSON event a line, in
chunks that split lines anywhere."""

from __future__ import annotations

import json
from collections.abc import Iterator

from nri_framework.agent.kube import watch_events


class Chunks:
    def __init__(self, data: bytes, size: int) -> None:
        self.data = data
        self.size = size

    def stream(self, amt: int | None = None, decode_content: bool = False) -> Iterator[bytes]:
        for i in range(0, len(self.data), self.size):
            yield self.data[i : i + self.size]


EVENTS = [
    {"type": "ADDED", "object": {"metadata": {"name": "default", "resourceVersion": "5"}}},
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
    {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}},
]


def test_events_across_chunk_boundaries() -> None:
    data = b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS)
    for size in (1, 7, 64, len(data)):
        got = list(watch_events(Chunks(data, size)))
        assert got == [(e["type"], e["object"]) for e in EVENTS], size


def test_last_line_without_newline_and_blank_lines() -> None:
    data = b"\n" + json.dumps(EVENTS[0]).encode() + b"\n\n" + json.dumps(EVENTS[1]).encode()
    assert [t for t, _ in watch_events(Chunks(data, 5))] == ["ADDED", "BOOKMARK"]


def lines(*events: dict[str, object]) -> Chunks:
    return Chunks(b"".join(json.dumps(e).encode() + b"\n" for e in events), 16)


def test_informer_lists_watches_and_lists_again_after_410() -> None:
    import threading

    from nri_framework.agent.kube import Informer, KubeError

    got: list[tuple[str, object]] = []
    watched_from: list[str | None] = []
    snapshots = iter([([{"n": 1}], "10"), ([{"n": 2}], "20")])
    done = threading.Event()

    def snapshot() -> tuple[list[dict[str, object]], str | None]:
        try:
            return next(snapshots)
        except StopIteration:
            done.set()
            raise KubeError(0, "no more") from None

    def open_watch(rv: str | None) -> Chunks:
        watched_from.append(rv)
        n = len(watched_from)
        if n == 1:  # an event, then the server closes the watch (its timeout)
            return lines({"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "11"}}})
        if n == 2:  # resumed from the last version seen; a bookmark; then expired
            return lines(
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                {"type": "ERROR", "object": {"code": 410, "message": "gone"}},
            )
        if n == 3:  # after the second list: broken
            raise KubeError(500, "boom")
        return lines()

    inf = Informer("test", snapshot, open_watch, lambda k, p: got.append((k, p)), retry_min=0.01)
    inf.start()
    assert done.wait(5)
    inf.stop()
    inf.join(5)
    assert watched_from == ["10", "11", "20"]
    assert got == [
        ("SYNC", [{"n": 1}]),
        ("MODIFIED", {"metadata": {"resourceVersion": "11"}}),
        ("SYNC", [{"n": 2}]),
    ]
