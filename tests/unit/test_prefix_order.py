"""Line order for the prefix cache (`backfill.batches.prefix_order`) and the validation activity
writing each route's line list in that order, the output's order untouched."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

from activities.validation import ValidationActivities
from backfill.batches.prefix_order import BLOCK_BYTES, order, prefix_key, prompt_text, reorder
from backfill.files import FileStore
from backfill.platform.config import Settings
from backfill.platform.config.sections import Limits
from backfill.platform.messages import ValidateInput

SYSTEM_A = "You are a careful translator. " * 20  # 600 bytes: over two levels
SYSTEM_B = "You are a terse summariser. " * 20
DOC = {n: f"Document {n}: " + "lorem ipsum dolor sit amet " * 40 for n in range(3)}


def chat(system: str | None, user: str) -> dict[str, object]:
    messages = [{"role": "system", "content": system}] if system else []
    return {"model": "demo", "messages": [*messages, {"role": "user", "content": user}]}


def keys(bodies: list[dict[str, object]]) -> list[bytes]:
    return [prefix_key(prompt_text(b, "messages")) for b in bodies]


def test_lines_sharing_a_system_prompt_start_together_in_input_order() -> None:
    bodies = [chat(SYSTEM_A if i % 2 == 0 else SYSTEM_B, f"text {i}") for i in range(6)]
    assert order(keys(bodies)) == [0, 2, 4, 1, 3, 5]


def test_a_document_asked_several_questions_is_asked_together() -> None:
    # Every line shares the system prompt; each document is asked three questions, interleaved.
    bodies = [chat(SYSTEM_A, DOC[d] + f" Question {q}?") for q in range(3) for d in range(3)]
    assert order(keys(bodies)) == [0, 3, 6, 1, 4, 7, 2, 5, 8]


def test_nothing_shared_keeps_input_order_and_same_prompts_group() -> None:
    distinct = [chat(None, f"hello {i}") for i in range(50)]
    assert order(keys(distinct)) == list(range(50))
    same = [chat(None, "x" if i % 3 else "y") for i in range(7)]
    assert order(keys(same)) == [0, 3, 6, 1, 2, 4, 5]


def test_a_shared_prefix_shorter_than_a_level_is_not_grouped() -> None:
    short = "Be brief. "  # well under BLOCK_BYTES
    assert len(short) < BLOCK_BYTES
    bodies = [chat(short, f"{i}") for i in range(4)]
    assert order(keys(bodies)) == [0, 1, 2, 3]


def test_the_prompt_is_what_the_server_reads_first() -> None:
    response = {"model": "demo", "instructions": "Be kind.", "input": "hi"}
    assert prompt_text(response, "input") == "Be kind.\x1fhi\x1f"
    assert prompt_text({"prompt": ["once", 7]}, "prompt") == "once\x1f7\x1f"
    message = {"role": "user", "content": "x" * 100_000}
    text = prompt_text({"messages": [message]}, "messages")
    assert text == "role\x1fuser\x1fcontent\x1f" + "x" * (4096 - 18) + "\x1f"
    # Keys are the same in every process (no per-process hash seed).
    assert prefix_key("abc").hex() == prefix_key("abc").hex()
    assert len(prefix_key("a" * 10_000)) == 16 * 8


def test_reorder_keeps_the_route_s_line_numbers() -> None:
    ks = keys([chat(SYSTEM_A if n in (1, 7, 9) else SYSTEM_B, str(n)) for n in range(10)])
    assert list(reorder(array("I", [1, 4, 7, 9]), ks)) == [1, 7, 9, 4]


def write_input(store: FileStore, bodies: list[dict[str, object]]) -> str:
    up = store.begin_upload(1 << 30)
    for i, body in enumerate(bodies):
        line = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions"}
        up.write(json.dumps({**line, "body": body}).encode() + b"\n")
    return up.finish(workspace="w", filename="in.jsonl", purpose="batch").id


def validate(tmp_path: Path, ordered: bool) -> tuple[FileStore, str]:
    settings = Settings(
        models=[{"id": "demo", "routes": [{"id": "r1", "base_url": "http://upstream/v1"}]}],
        limits=Limits(order_lines_by_prefix=ordered),
    )
    store = FileStore(tmp_path / str(ordered))
    bodies = [chat(SYSTEM_A, DOC[d] + f" Question {q}?") for q in range(2) for d in range(3)]
    file_id = write_input(store, bodies)
    store.snapshot_input("batch_1", file_id)
    out = ValidationActivities(settings, store)._validate(
        ValidateInput(batch_id="batch_1", input_file_id=file_id, endpoint="/v1/chat/completions")
    )
    assert out.errors == [] and out.total == 6
    return store, file_id


def test_validation_writes_the_route_s_lines_in_prefix_order(tmp_path: Path) -> None:
    store, file_id = validate(tmp_path, ordered=True)
    assert [store.line_number("batch_1", 0, p) for p in range(6)] == [0, 3, 1, 4, 2, 5]
    # The input's lines keep their numbers: the output is assembled in input order.
    lines = list(store.iter_lines("batch_1", file_id))
    assert [n for n, _ in lines] == list(range(6))
    assert [json.loads(raw)["custom_id"] for _, raw in lines] == [f"c{i}" for i in range(6)]
    unordered, _ = validate(tmp_path, ordered=False)
    assert [unordered.line_number("batch_1", 0, p) for p in range(6)] == list(range(6))
