"""`backfill batch` commands (typer): submit, watch, list, get, cancel, pause, resume (download
and retry are `tools.client.results`). Each returns its exit code; `run` maps errors to theirs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, cast

import openai
import typer
from rich.table import Table

from tools.client import results as _results  # noqa: F401  (registers download and retry)
from tools.client.app import (
    Interval,
    app,
    check_window,
    conn_of,
    err,
    exit_code,
    follow,
    make_dir,
    metadata_of,
    out,
    report_end,
    save_files,
    say_how_it_ended,
)
from tools.client.connection import CommandError, api_error
from tools.client.watching import extension, wait_reason
from tools.client.wording import counts, estimate_line, headline, utc_time


@app.command()
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A JSONL input.")],
    endpoint: Annotated[str, typer.Option(help="The endpoint of every line.")] = (
        "/v1/chat/completions"
    ),
    window: Annotated[
        str, typer.Option(help="The completion window: 24h ... 168h.", callback=check_window)
    ] = "24h",
    metadata: Annotated[
        list[str] | None, typer.Option(help="key=value, repeatable.", show_default=False)
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Watch it to the end, then save its files next to FILE.")
    ] = False,
    interval: Interval = 1.0,
) -> int:
    """Upload FILE and create a batch of it."""
    conn = conn_of(ctx)
    meta = metadata_of(metadata or [])
    with file.open("rb") as f:
        uploaded = conn.openai.files.create(file=(file.name, f), purpose="batch")
    batch = conn.openai.batches.create(
        input_file_id=uploaded.id,
        endpoint=cast(Any, endpoint),
        completion_window=cast(Any, window),
        metadata=meta or None,
    )
    out.print(f"Created {batch.id} from {file} ({uploaded.id})")
    if (estimate := estimate_line(extension(batch))) is not None:
        out.print(f"Estimate: {estimate}")
    if not wait:
        return 0
    ended = follow(conn, batch.id, interval)
    if ended is None:
        return 130
    return report_end(conn, ended, file.parent, file.stem)


@app.command("watch")
def watch_(
    ctx: typer.Context,
    batch_id: str,
    directory: Annotated[
        Path | None, typer.Option("--download-to", help="Save its files here once it ends.")
    ] = None,
    interval: Interval = 1.0,
) -> int:
    """Watch a batch until it ends (Ctrl-C stops watching, never the batch)."""
    conn = conn_of(ctx)
    if directory is not None:  # made now: a path that cannot be a directory fails before watching
        make_dir(directory, "--download-to")
    ended = follow(conn, batch_id, interval)
    if ended is None:
        return 130
    say_how_it_ended(ended)
    if directory is not None:
        save_files(conn, ended, directory, ended.id)
    return exit_code(ended)


@app.command("list")
def list_(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One Batch object per line.")] = False,
) -> int:
    """The newest batches."""
    page = conn_of(ctx).openai.batches.list(limit=limit)
    batches = list(page.data)
    if as_json:
        for b in batches:
            print(b.model_dump_json())
        return 0
    header = ("id", "status", "completed", "failed", "total", "created", "why it waits")
    rows = [
        (
            b.id,
            b.status,
            str(b.request_counts.completed if b.request_counts else ""),
            str(b.request_counts.failed if b.request_counts else ""),
            str(b.request_counts.total if b.request_counts else ""),
            utc_time(b.created_at),
            wait_reason(b),
        )
        for b in batches
    ]
    if not out.is_terminal:  # for scripts and logs: tab-separated, nothing cut
        for row in (header, *rows):
            print("\t".join(row))
        return 0
    table = Table(*header)
    # The id, the status and the counts are never cut on a narrow terminal: the other
    # columns wrap.
    for i in range(5):
        table.columns[i].no_wrap = True
        table.columns[i].min_width = max(len(row[i]) for row in (header, *rows))
    for row in rows:
        table.add_row(*row)
    out.print(table)
    return 0


@app.command()
def get(
    ctx: typer.Context,
    batch_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="The Batch object as JSON.")] = False,
) -> int:
    """One batch: a readable summary, or --json."""
    batch = conn_of(ctx).openai.batches.retrieve(batch_id)
    if as_json:
        print(batch.model_dump_json(indent=2))
        return 0
    ext = extension(batch)
    rows: list[tuple[str, Any]] = [
        ("status", batch.status + (" (paused)" if ext.get("paused") else "")),
        ("counts", counts(batch)),
        ("endpoint", batch.endpoint),
        ("window", batch.completion_window),
        ("created", utc_time(batch.created_at)),
        ("expires", utc_time(batch.expires_at)),
    ]
    for name in ("completed_at", "failed_at", "expired_at", "cancelled_at"):
        if getattr(batch, name, None):
            rows.append((name.removesuffix("_at"), utc_time(getattr(batch, name))))
    if ext.get("paused") and batch.status == "in_progress":
        rows.append(("pace", "none while paused: lines move again once resumed"))
    elif ext.get("lines_per_second") is not None:
        finish = ext.get("expected_finish_at")
        pace = f"{ext['lines_per_second']} lines/s"
        pace += f", expected to finish {utc_time(finish)}" if finish else ", not moving"
        rows.append(("pace", pace + (" — AT RISK of expiring" if ext.get("at_risk") else "")))
    if (estimate := estimate_line(ext)) is not None:
        rows.append(("estimate at submit", estimate))
    if wait_reason(batch):
        rows.append(("waiting", wait_reason(batch)))
    for r in ext.get("routes") or []:
        rows.append(
            (
                f"route {r.get('route')}",
                f"{r.get('state')}, {r.get('finished_lines')}/{r.get('total_lines')} lines, "
                f"{r.get('running_lines')} running",
            )
        )
    rows += [("input", batch.input_file_id), ("output", batch.output_file_id or "—")]
    rows.append(("errors", batch.error_file_id or "—"))
    if batch.metadata:
        rows.append(("metadata", ", ".join(f"{k}={v}" for k, v in batch.metadata.items())))
    if ext.get("retries"):
        rows.append(("retries", ", ".join(ext["retries"])))
    if batch.errors and batch.errors.data:
        for e in batch.errors.data:
            rows.append(("error", f"{e.code} (line {e.line}): {e.message}"))
    out.print(f"[bold]{batch.id}[/]")
    for name, value in rows:
        out.print(f"  {name:<12} {value}", markup=False)
    return 0


@app.command()
def cancel(ctx: typer.Context, batch_id: str) -> int:
    """Cancel a batch: no new line starts, running ones finish."""
    out.print(headline(conn_of(ctx).openai.batches.cancel(batch_id)))
    return 0


@app.command()
def pause(ctx: typer.Context, batch_id: str) -> int:
    """Hold a batch's lines back until resumed (backfill extension)."""
    body = conn_of(ctx).extension("POST", f"/batches/{batch_id}/pause")
    out.print(f"{batch_id} paused ({body.get('status')})")
    return 0


@app.command()
def resume(ctx: typer.Context, batch_id: str) -> int:
    """Let a paused batch's lines run again (backfill extension)."""
    body = conn_of(ctx).extension("POST", f"/batches/{batch_id}/resume")
    out.print(f"{batch_id} resumed ({body.get('status')})")
    return 0


def run(argv: list[str]) -> int:
    try:
        rv = app(args=argv, prog_name="backfill batch", standalone_mode=False)
    except typer.TyperException as e:  # a usage error: typer says what and how
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            err.print(f"Error: {e.format_message()}", markup=False)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err.print("Aborted.")
        return 130
    except CommandError as e:
        err.print(f"Error: {e.message}", markup=False)
        return e.exit_code
    except openai.OpenAIError as e:
        error = api_error(e)
        err.print(f"Error: {error.message}", markup=False)
        return error.exit_code
    sys.stdout.flush()
    return rv if isinstance(rv, int) else 0
