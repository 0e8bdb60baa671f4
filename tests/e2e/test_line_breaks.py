"""Every record of an output or error file is one line for any reader. JSON allows U+2028,
U+2029 and U+0085 raw inside a string, a real model's answer can carry them (vLLM sends them
unescaped), and `str.splitlines()` ends a line at each: the gateway writes them escaped, and its
own readers (`backfill batch retry` reading the error file) split JSONL at "\\n" only."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import wait_terminal
from tests.e2e.test_cli import cli
from tools.sim import SimConfig
from tools.sim.faults import SimFault

BREAKS = ("\u2028", "\u2029", "\u0085")


def _line(custom_id: str, content: str) -> str:
    body = {"model": "demo", "messages": [{"role": "user", "content": content}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return json.dumps(line, ensure_ascii=False)


async def test_answers_with_unicode_line_breaks_read_back_one_record_a_line(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    # The first request fails with a message that carries the three characters (the upstream's
    # error body, kept in the error record); every answer echoes them (the simulator repeats
    # the prompt's words, as a model may).
    message = "refused:\u2028line\u2029paragraph\u0085next"
    fault = SimFault(status=400, count=1, message=message)
    stack = await make_stack(cap=1, sim=SimConfig(model_names=[], latency_ms=5, faults=[fault]))
    n = 6
    lines = [_line(f"id{BREAKS[i % 3]}{i}", f"a{BREAKS[i % 3]}b c\u2028d\u0085e") for i in range(n)]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    client = stack.client()
    rc, out = await cli(stack, "submit", str(source), "--wait", cwd=tmp_path)
    assert rc == 0, out
    batch_id = re.search(r"Created (batch_\w+)", out).group(1)  # type: ignore[union-attr]
    batch = await wait_terminal(client, batch_id)
    assert batch.request_counts.completed == n - 1 and batch.request_counts.failed == 1

    # A user reads the files as most do: text, str.splitlines(), json.loads per line.
    output = (await client.files.content(batch.output_file_id)).text
    records = [json.loads(x) for x in output.splitlines()]
    assert len(records) == n - 1
    for r in records:
        answer = r["response"]["body"]["choices"][0]["message"]["content"]
        assert "\u2028" in answer and "\u0085" in answer, answer  # the answer, intact
        assert r["custom_id"][2] in BREAKS
    errors = (await client.files.content(batch.error_file_id)).text
    (failed,) = [json.loads(x) for x in errors.splitlines()]
    assert failed["response"]["status_code"] == 400
    assert failed["response"]["body"]["error"]["message"] == message
    for raw in (output, errors):
        assert not any(c in raw for c in BREAKS)  # escaped, \u2028 ...

    # The CLI saved the same files; its retry reads the error file and sends exactly that line.
    saved = (tmp_path / "in.output.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in saved) == sorted(
        r["custom_id"] for r in records
    )
    rc, out = await cli(stack, "retry", batch_id, "--wait", "--dir", str(tmp_path), cwd=tmp_path)
    assert rc == 0, out
    retry_id = re.search(r"Created (batch_\w+)", out).group(1)  # type: ignore[union-attr]
    redone = (tmp_path / f"{retry_id}.output.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["custom_id"] for x in redone] == [failed["custom_id"]]
