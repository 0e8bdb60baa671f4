"""`/v1/responses` fields that would escape scheduling are refused, live and in a batch
(issue 40, decision 0028): `background: true` answered 400 before anything goes upstream, and
a batch line carrying it fails validation, so nothing "completes" with a queued stub."""

from __future__ import annotations

import json

import openai
import pytest

from tests.e2e.stack import Stack, wait_terminal

RESPONSES = "/v1/responses"


async def test_live_background_and_chaining_are_refused(shared_stack: Stack) -> None:
    stack = shared_stack
    oa = stack.client()
    sent = len(stack.sim.app.seen)
    for extra in ({"background": True}, {"previous_response_id": "resp_someone_elses"}):
        with pytest.raises(openai.BadRequestError) as err:
            await oa.responses.create(model="demo", input="hi", **extra)  # type: ignore[call-overload]
        [field] = extra
        assert err.value.status_code == 400
        assert err.value.body["param"] == field  # type: ignore[index]
        assert err.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert len(stack.sim.app.seen) == sent  # nothing went upstream
    # Without them, the same request is answered.
    resp = await oa.responses.create(model="demo", input="one two")
    assert resp.output_text == "Simulated one two"


async def test_a_batch_line_asking_for_background_fails_validation(shared_stack: Stack) -> None:
    stack = shared_stack
    oa = stack.client()
    lines = [
        {"custom_id": "plain", "method": "POST", "url": RESPONSES,
         "body": {"model": "demo", "input": "hi"}},
        {"custom_id": "bg", "method": "POST", "url": RESPONSES,
         "body": {"model": "demo", "input": "hi", "background": True}},
    ]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file = await oa.files.create(file=("bg.jsonl", data), purpose="batch")
    batch = await oa.batches.create(
        input_file_id=file.id, endpoint=RESPONSES, completion_window="24h"
    )
    done = await wait_terminal(oa, batch.id, within=120)
    assert done.status == "failed", done
    assert done.errors is not None and done.errors.data is not None
    [error] = done.errors.data
    assert (error.code, error.line, error.param) == ("invalid_body", 2, "body.background")
