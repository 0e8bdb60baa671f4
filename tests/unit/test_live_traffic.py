"""The per-route in-flight counter: every way out of a request uncounts it."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from api.live.traffic import TTFT_WINDOW_S, LiveTraffic


def gauge(route: str) -> float | None:
    return REGISTRY.get_sample_value("gateway_live_in_flight", {"route": route})


def test_counts_and_snapshot_and_gauge() -> None:
    live = LiveTraffic(["ut-a", "ut-b"])
    assert live.snapshot() == {"ut-a": 0, "ut-b": 0} and gauge("ut-b") == 0
    with live.in_flight("ut-a"), live.in_flight("ut-a"):
        assert live.count("ut-a") == 2 and gauge("ut-a") == 2
        with live.in_flight("ut-b"):
            assert live.snapshot() == {"ut-a": 2, "ut-b": 1}
    assert live.snapshot() == {"ut-a": 0, "ut-b": 0} and gauge("ut-a") == 0


def test_errors_release_the_count() -> None:
    live = LiveTraffic(["ut-c"])
    with pytest.raises(RuntimeError), live.in_flight("ut-c"):
        raise RuntimeError("upstream broke")
    assert live.count("ut-c") == 0


async def test_cancellation_releases_the_count() -> None:
    live = LiveTraffic(["ut-d"])
    started = asyncio.Event()

    async def request() -> None:
        with live.in_flight("ut-d"):
            started.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(request())
    await started.wait()
    assert live.count("ut-d") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert live.count("ut-d") == 0


def test_listeners_see_each_change_and_cannot_break_counting() -> None:
    live = LiveTraffic(["ut-e"])
    seen: list[tuple[str, int]] = []

    def broken(route: str, count: int) -> None:
        raise ValueError("reporter bug")

    live.subscribe(broken)
    unsubscribe = live.subscribe(lambda r, c: seen.append((r, c)))
    with live.in_flight("ut-e"):
        pass
    unsubscribe()
    with live.in_flight("ut-e"):
        pass
    assert seen == [("ut-e", 1), ("ut-e", 0)]
    assert live.count("ut-e") == 0


def test_recent_ttft_is_the_p90_of_the_last_seconds_of_streams() -> None:
    now = [100.0]
    live = LiveTraffic(["ut-t"], clock=lambda: now[0])
    assert live.recent_ttft_ms("ut-t") is None
    for i in range(10):
        live.record_ttft("ut-t", 0.05 + 0.01 * i)  # 50 .. 140 ms
    assert live.recent_ttft_ms("ut-t") == pytest.approx(130.0)  # 9th of 10
    now[0] += TTFT_WINDOW_S / 2
    live.record_ttft("ut-t", 2.0)
    assert live.recent_ttft_ms("ut-t") == pytest.approx(140.0)  # 10th of 11
    now[0] += TTFT_WINDOW_S / 2 + 0.01  # the first ten are out of the window
    assert live.recent_ttft_ms("ut-t") == pytest.approx(2000.0)
    now[0] += TTFT_WINDOW_S
    assert live.recent_ttft_ms("ut-t") is None


def test_a_workspace_counts_at_most_its_share_and_others_still_count() -> None:
    live = LiveTraffic(["ut-s"])
    alpha = [live.take("ut-s", "alpha", share=2) for _ in range(5)]
    assert live.count("ut-s") == 2 and gauge("ut-s") == 2  # 5 in flight, 2 counted
    beta = live.take("ut-s", "beta", share=2)
    assert live.count("ut-s") == 3  # another workspace's request counts
    alpha[0].release()
    alpha[1].release()
    alpha[2].release()
    assert live.count("ut-s") == 3  # still 2 of alpha's in flight: its share stays full
    alpha[3].release()
    assert live.count("ut-s") == 2
    alpha[3].release()  # a second release does nothing
    assert live.count("ut-s") == 2
    alpha[4].release()
    beta.release()
    assert live.count("ut-s") == 0 and gauge("ut-s") == 0


def test_no_share_counts_every_request() -> None:
    live = LiveTraffic(["ut-n"])
    taken = [live.take("ut-n", "alpha") for _ in range(4)]
    assert live.count("ut-n") == 4
    for count in taken:
        count.release()
    assert live.count("ut-n") == 0


def test_released_early_inside_in_flight_is_uncounted_once() -> None:
    live = LiveTraffic(["ut-r"])
    with live.in_flight("ut-r", "alpha", 8) as count:
        assert live.count("ut-r") == 1
        count.release()  # the model server is done; the client still reads
        assert live.count("ut-r") == 0
    assert live.count("ut-r") == 0
