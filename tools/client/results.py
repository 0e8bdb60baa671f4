"""`backfill batch download` and `backfill batch retry`: a batch's results, whole or as they
are committed, and a new batch of exactly the lines that did not complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, cast

import openai
import typer
from openai.types import Batch

from tools.client.app import (
    Interval,
    app,
    check_window,
    conn_of,
    follow,
    make_dir,
    metadata_of,
    out,
    report_end,
    save_files,
)
from tools.client.connection import CommandError, Connection
from tools.client.raw_page import read_page
from tools.client.selection import input_lines, output_ids, parse_kinds, to_retry
from tools.client.watching import TERMINAL, extension

PARTIAL_PAGE = 1000


@app.command()
def download(
    ctx: typer.Context,
    batch_id: str,
    directory: Annotated[Path, typer.Option("--dir", file_okay=False)] = Path("."),
    partial: Annotated[
        bool,
        typer.Option(
            help="The results committed so far, also while it runs; run it again to append "
            "only what is new."
        ),
    ] = False,
) -> int:
    """Save a batch's output and error files (<id>.output.jsonl, <id>.errors.jsonl)."""
    conn = conn_of(ctx)
    make_dir(directory, "--dir")
    if partial:
        return _download_partial(conn, batch_id, directory)
    batch = conn.openai.batches.retrieve(batch_id)
    if batch.status not in TERMINAL:
        raise CommandError(
            f"{batch_id} is {batch.status}: its files exist once it ends. "
            "For what it has finished so far: --partial."
        )
    save_files(conn, batch, directory, batch.id)
    return 0


def _download_partial(conn: Connection, batch_id: str, directory: Path) -> int:
    """Pages from the saved cursor on, appended to <id>.output.partial.jsonl and
    <id>.errors.partial.jsonl; the cursor is saved after each page."""
    cursor_path = directory / f"{batch_id}.partial-cursor"
    after = cursor_path.read_text().strip() if cursor_path.exists() else None
    paths = {
        "output": directory / f"{batch_id}.output.partial.jsonl",
        "error": directory / f"{batch_id}.errors.partial.jsonl",
    }
    new = 0
    while True:
        params: dict[str, Any] = {"limit": PARTIAL_PAGE}
        if after:
            params["after"] = after
        body = conn.extension_bytes("GET", f"/batches/{batch_id}/results", **params)
        try:
            page = read_page(body)
        except ValueError as err:
            raise CommandError(f"The server's results page is not one: {err}", 1) from None
        records: dict[str, list[bytes]] = {"output": [], "error": []}
        for kind, record in page.records:  # the committed bytes, as the final files hold them
            records[kind].append(record)
        for kind, lines in records.items():
            if lines:
                with paths[kind].open("ab") as f:
                    f.write(b"".join(line + b"\n" for line in lines))
        new += len(page.records)
        after = page.next_after
        cursor_path.write_text(after + "\n")
        if not page.has_more or not page.records:
            break
    state = "more may come" if page.has_more else "that is all of them"
    out.print(f"{new} new records saved in {directory} ({state})")
    return 0


@app.command()
def retry(
    ctx: typer.Context,
    batch_id: str,
    only: Annotated[
        str, typer.Option(help="Which lines: failed, expired, cancelled (comma-separated).")
    ] = "failed",
    skip_status: Annotated[
        list[int] | None,
        typer.Option(
            help="Leave out lines the server answered with this status (repeatable).",
            show_default=False,
        ),
    ] = None,
    window: Annotated[
        str | None, typer.Option(help="Default: the original's.", callback=check_window)
    ] = None,
    metadata: Annotated[list[str] | None, typer.Option(show_default=False)] = None,
    wait: Annotated[bool, typer.Option(help="Watch it to the end, then save its files.")] = False,
    directory: Annotated[Path, typer.Option("--dir", file_okay=False)] = Path("."),
    interval: Interval = 1.0,
) -> int:
    """A new batch of exactly the original's failed (or expired...) lines, same custom_ids and
    bodies, with metadata retry_of=<the original>."""
    try:
        kinds = parse_kinds(only)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--only") from None
    meta = metadata_of(metadata or [])
    if wait:  # made now: a path that cannot be a directory fails before anything is created
        make_dir(directory, "--dir")
    conn = conn_of(ctx)
    batch = conn.openai.batches.retrieve(batch_id)
    if batch.status not in TERMINAL:
        raise CommandError(
            f"{batch_id} is still {batch.status}: retry its lines once it has ended "
            "(or cancel it first)."
        )
    skip = set(skip_status or [])
    what = f"{only} lines" + (
        f" (without status {', '.join(map(str, sorted(skip)))})" if skip else ""
    )
    if not batch.error_file_id:
        raise CommandError(f"Nothing to retry: {batch_id} has no error file (no line failed).")
    error_text = conn.openai.files.content(batch.error_file_id).text
    # JSONL lines end at "\n" only: str.splitlines() would also cut at a U+2028 inside a string.
    records = [json.loads(line) for line in error_text.split("\n") if line.strip()]
    custom_ids = to_retry(records, kinds, skip)
    done_by, done = _completed_by_retries(conn, batch)
    if custom_ids and not custom_ids - done:
        raise CommandError(
            f"Nothing to retry: the {what} of {batch_id} were completed by its retries "
            f"({', '.join(done_by)})."
        )
    custom_ids -= done
    if not custom_ids:
        raise CommandError(f"Nothing to retry: {batch_id} has no {what}.")
    try:
        content = conn.openai.files.content(batch.input_file_id).content
    except openai.NotFoundError:
        raise CommandError(
            f"The input file {batch.input_file_id} of {batch_id} was deleted: "
            "its lines cannot be read again."
        ) from None
    lines = input_lines(content, custom_ids)
    if len(lines) != len(custom_ids):
        raise CommandError(
            f"Only {len(lines)} of the {len(custom_ids)} {what} are in the input file "
            f"{batch.input_file_id}: was it replaced?"
        )
    name = f"{batch_id}.retry.jsonl"
    uploaded = conn.openai.files.create(file=(name, b"\n".join(lines) + b"\n"), purpose="batch")
    new = conn.openai.batches.create(
        input_file_id=uploaded.id,
        endpoint=cast(Any, batch.endpoint),
        completion_window=cast(Any, window or batch.completion_window),
        metadata={**meta, "retry_of": batch_id},
    )
    out.print(f"Created {new.id}: {len(lines)} {what} of {batch_id}")
    if not wait:
        return 0
    ended = follow(conn, new.id, interval)
    if ended is None:
        return 130
    return report_end(conn, ended, directory, ended.id)


MAX_RETRY_DEPTH = 10
"""Retries of retries followed when collecting what earlier retries completed."""


def _completed_by_retries(conn: Connection, original: Batch) -> tuple[list[str], set[str]]:
    """The earlier retries of `original` (and of those, recursively) and the custom_ids their
    output files hold: a line an earlier retry completed is not sent again, so each custom_id
    is completed once across the original and all its retries. An earlier retry still running
    refuses the new one (its lines may yet complete)."""
    seen: list[str] = []
    done: set[str] = set()
    todo = [(r, 1) for r in extension(original).get("retries") or []]
    while todo:
        retry_id, depth = todo.pop(0)
        if retry_id in seen or depth > MAX_RETRY_DEPTH:
            continue
        seen.append(retry_id)
        earlier = conn.openai.batches.retrieve(retry_id)
        if earlier.status not in TERMINAL:
            raise CommandError(
                f"{retry_id}, a retry of {original.id}, is still {earlier.status}: its lines may "
                "still complete. Retry once it has ended (or cancel it first)."
            )
        if earlier.output_file_id:
            done |= output_ids(conn.openai.files.content(earlier.output_file_id).content)
        todo += [(r, depth + 1) for r in extension(earlier).get("retries") or []]
    return seen, done
