"""docs/webhooks.md, the webhooks walkthrough (issue 39: the pieces were in three pages), run as a
reader runs it: every block that is not marked `not run`, in order, in one directory, against a
real stack started with the operator's settings of step 1. The receiver it starts verifies with
the `openai` SDK, and the batch's `batch.completed` event must arrive and be logged `delivered`.

The dev setup's names are the stack's: its api URL, its admin key for `sk-backfill-dev`, the admin
key's workspace for `default`, a free port for the receiver's 9000."""

from __future__ import annotations

import re
from pathlib import Path

from tests.e2e.conftest import MakeStack
from tests.e2e.test_docs_commands import Runner, clean_env, runnable, stack_code
from tools.dev.procs import free_port

PAGE = "docs/webhooks.md"
OPERATOR = {
    "BACKFILL_WEBHOOK_KEY": "docs-walkthrough-key-0123456789abcdef0123",
    "BACKFILL_WEBHOOK_ALLOWED_DESTINATIONS": "127.0.0.0/8",
}


def test_the_walkthrough_has_its_steps() -> None:
    blocks = runnable(PAGE)
    assert [b.lang for b in blocks] == ["sh", "sh", "python", "python"]
    text = (Path(__file__).resolve().parents[2] / PAGE).read_text()
    for name in OPERATOR:  # the settings the test's stack gets are step 1's
        assert f"export {name}=" in text, name
    assert "127.0.0.0/8" in text


async def test_the_webhooks_walkthrough_runs(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack(extra_env=OPERATOR)
    port = free_port()

    def local(code: str) -> str:
        code = stack_code(code, stack).replace("sk-test-admin", stack.key("sk-test-admin"))
        code = code.replace("/workspaces/default/", f"/workspaces/{stack.workspaces['ops']}/")
        return re.sub(r"127\.0\.0\.1([:\", ]+)9000\b", rf"127.0.0.1\g<1>{port}", code)

    runner = Runner(tmp_path, clean_env())
    try:
        outputs = [await runner.run(b, local(b.code)) for b in runnable(PAGE)]
    finally:
        await runner.close()
    made, _, arrived, logged = outputs
    assert f"http://127.0.0.1:{port}/hook ['batch.completed', 'batch.failed']" in made, made
    assert re.search(r"^batch\.completed batch_\w+ evt_\w+$", arrived, re.M), arrived
    assert logged.strip() == "batch.completed ['delivered']", logged
