"""The relay buffer between a live answer's upstream and its client: bounded per answer and per
process, and a reader that can always make progress."""

from __future__ import annotations

import asyncio

from api.live.relay import RelayBudget, RelayBuffer


async def test_an_answer_within_its_bound_is_read_whole_before_the_client_takes_any() -> None:
    budget = RelayBudget(1024)
    buf = RelayBuffer(300, budget)
    for _ in range(3):
        await asyncio.wait_for(buf.put(b"x" * 100), 1)
    buf.end(complete=True)
    assert buf.size == 300 and budget.used == 300
    got = [await buf.get() for _ in range(4)]
    assert got == [b"x" * 100] * 3 + [None] and buf.complete
    assert budget.used == 0


async def test_put_waits_past_the_answer_bound_until_the_client_takes_a_chunk() -> None:
    budget = RelayBudget(1024)
    buf = RelayBuffer(200, budget)
    await buf.put(b"a" * 100)
    await buf.put(b"b" * 100)
    third = asyncio.create_task(buf.put(b"c" * 100))
    await asyncio.sleep(0.05)
    assert not third.done() and buf.size == 200  # held at the bound
    assert await buf.get() == b"a" * 100
    await asyncio.wait_for(third, 1)
    assert buf.size == 200 and budget.used == 200


async def test_the_process_budget_is_shared_and_an_empty_buffer_always_takes_one_chunk() -> None:
    budget = RelayBudget(150)
    first, second = RelayBuffer(1000, budget), RelayBuffer(1000, budget)
    await first.put(b"x" * 100)
    await first.put(b"y" * 50)
    assert budget.used == 150
    # The budget is spent: another answer still gets its one chunk in hand, uncharged...
    await asyncio.wait_for(second.put(b"z" * 100), 1)
    assert budget.used == 150 and second.size == 100
    # ... but no second one until the budget frees.
    more = asyncio.create_task(second.put(b"w" * 100))
    await asyncio.sleep(0.05)
    assert not more.done()
    assert await first.get() == b"x" * 100  # 100 bytes back to the budget
    await asyncio.wait_for(more, 1)
    assert budget.used == 150
    first.close()
    second.close()
    assert budget.used == 0 and first.size == second.size == 0


async def test_a_broken_answer_ends_incomplete() -> None:
    buf = RelayBuffer(1000, RelayBudget(1000))
    await buf.put(b"part")
    buf.end(complete=False)
    assert await buf.get() == b"part"
    assert await buf.get() is None and not buf.complete
