"""A worker's lines hold their requests and answers against the process's buffer budget, a share
per workspace (issue 47): one workspace's large answers cannot take the worker's memory from
another's lines, and a line that finds no room is never lost: it goes back to its queue unsent
(held), or, mid-answer, is sent again later."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from activities.lines import run_line as lines
from activities.preemption.board import PreemptBoard
from backfill.batches.streamed_answer import Partial
from backfill.routes.gates.preempt import PreemptPolicy
from backfill.tenancy.byte_budget import ByteBudget
from tests.unit.test_run_line import line, make, record, run

OK = {"id": "x", "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def test_a_full_workspace_share_holds_its_lines_unsent_and_not_another_workspaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lines, "BUFFER_WAIT_SECONDS", 0.3)
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=OK)

    acts, file_id, store = make(tmp_path, handler)
    acts.buffers = ByteBudget(total=1 << 20, share=256 << 10)
    hog = acts.buffers.claim("a")
    assert hog.resize(256 << 10)  # workspace a's running answers fill its share

    held = run(acts, line(file_id, 0).model_copy(update={"workspace": "a"}))
    assert held.held and held.preempted and not held.retry  # back to its queue, nothing counted
    assert sent == [] and store.get_result("batch_unit", 0) is None

    other = run(acts, line(file_id, 1).model_copy(update={"workspace": "b"}))
    assert other.ok and len(sent) == 1 and record(store, 1)["response"]["body"] == OK
    assert acts.buffers.held == hog.size and acts.buffers.held_by("b") == 0  # given back


def test_an_answer_that_outgrows_the_room_left_is_sent_again_later(tmp_path: Path) -> None:
    big = {"id": "x", "text": "y" * 1500}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=json.dumps(big).encode())

    acts, file_id, store = make(tmp_path, handler)  # max_response_bytes 2048
    acts.buffers = ByteBudget(total=2048, share=2048)  # the request fits, not the answer twice
    out = run(acts, line(file_id, 0, final=False).model_copy(update={"workspace": "a"}))
    assert out.retry and not out.ok and out.status_code is None  # sent again, after a back-off
    assert store.get_result("batch_unit", 0) is None  # nothing committed: it runs again
    assert acts.buffers.held == 0

    acts.buffers = ByteBudget(total=1 << 20, share=1 << 20)  # room again: the same line runs
    out = run(acts, line(file_id, 0).model_copy(update={"workspace": "a"}))
    assert out.ok and record(store, 0)["response"]["body"] == big


def test_a_resumed_line_whose_kept_answer_does_not_fit_is_held_unsent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partial answer a preempted line kept is held (and sent again) with its request."""
    monkeypatch.setattr(lines, "BUFFER_WAIT_SECONDS", 0.3)
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=OK)

    acts, file_id, store = make(tmp_path, handler)
    board = PreemptBoard()
    board.set_policy("r1", PreemptPolicy(batch_seats=8, max_preemptions=3, resume=True))
    acts.preempt = board
    kept = Partial(
        head={"id": "x", "created": 1, "model": "demo"}, text="y" * 100_000, completion_tokens=9
    )
    store.put_partial("batch_unit", 0, kept.model_dump_json().encode())
    acts.buffers = ByteBudget(total=64 << 10, share=64 << 10)  # the line fits, not its answer
    out = run(acts, line(file_id, 0).model_copy(update={"workspace": "a", "preemptions": 1}))
    assert out.held and out.preempted and sent == [] and acts.buffers.held == 0
