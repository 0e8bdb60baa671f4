"""`backfill batch` commands (typer). Each returns its exit code; `run` maps errors to theirs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, cast

import openai
import typer
from openai.types import Batch
from rich.console import Console
from rich.table import Table

from tools.client.connection import DEFAULT_BASE_URL, CommandError, Connection, api_error
from tools.client.selection import input_lines, output_ids, parse_kinds, to_retry
from tools.client.watching import TERMINAL, extension, wait_reason, watch

app = typer.Typer(
    name="backfill batch",
    help="Submit, watch and manage batches on a backfill (or any OpenAI-compatible) server.\n\n"
    "The server is --base-url or OPENAI_BASE_URL; the key is read from OPENAI_API_KEY.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Interval = Annotated[float, typer.Option(help="Seconds between two looks at the batch.", min=0.2)]
PARTIAL_PAGE = 1000


def _conn(ctx: typer.Context) -> Connection:
    return cast(Connection, ctx.obj)


@app.callback()
def connect(
    ctx: typer.Context,
    base_url: Annotated[
        str, typer.Option("--base-url", envvar="OPENAI_BASE_URL", help="The server's /v1 URL.")
    ] = DEFAULT_BASE_URL,
) -> None:
    import os

    key = os.environ.get("OPENAI_API_KEY", "").strip()
    if not key:
        raise CommandError("Set OPENAI_API_KEY to your API key.")
    ctx.obj = Connection(base_url, key)
    ctx.call_on_close(ctx.obj.close)


def _metadata(pairs: list[str]) -> dict[str, str]:
    meta = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not key=value", param_hint="--metadata")
        meta[key] = value
    return meta


def _exit_code(batch: Batch) -> int:
    return 0 if batch.status == "completed" else 1


def _follow(conn: Connection, batch_id: str, interval: float) -> Batch | None:
    """Watch until the batch ends; None when the user stopped watching (Ctrl-C)."""
    try:
        return watch(lambda: conn.openai.batches.retrieve(batch_id), out, interval)
    except KeyboardInterrupt:
        err.print(
            f"Stopped watching. {batch_id} goes on; watch it again with: backfill batch watch "
            f"{batch_id}"
        )
        return None


def _download(conn: Connection, batch: Batch, directory: Path, stem: str) -> list[Path]:
    saved = []
    for label, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id)):
        if file_id:
            path = directory / f"{stem}.{label}.jsonl"
            conn.openai.files.content(file_id).write_to_file(path)
            saved.append(path)
    for path in saved:
        out.print(f"Saved {path}")
    return saved


def _ended(conn: Connection, batch: Batch, directory: Path, stem: str) -> int:
    _say_how_it_ended(batch)
    _download(conn, batch, directory, stem)
    return _exit_code(batch)


def _say_how_it_ended(batch: Batch) -> None:
    """The headline, and for a batch whose input was refused, each reason (there are no lines
    and no files to look at: the reasons are all there is)."""
    out.print(_headline(batch))
    for e in _input_errors(batch):
        err.print(f"  {e}", markup=False)


def _input_errors(batch: Batch) -> list[str]:
    if not batch.errors or not batch.errors.data:
        return []
    return [
        f"{e.code}" + (f" (line {e.line})" if e.line is not None else "") + f": {e.message}"
        for e in batch.errors.data
    ]


def _headline(batch: Batch) -> str:
    c = batch.request_counts
    refused = _input_errors(batch)
    if batch.status == "failed" and refused:
        n = len(refused)
        return f"{batch.id} failed: its input was refused ({n} error{'s' if n > 1 else ''})"
    counts = f"{c.completed} completed, {c.failed} failed of {c.total}" if c else "no counts"
    return f"{batch.id} {batch.status}: {counts}"


def _counts(batch: Batch) -> str:
    c = batch.request_counts
    return f"{c.completed} completed, {c.failed} failed of {c.total}" if c else "no counts"


@app.command()
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A JSONL input.")],
    endpoint: Annotated[str, typer.Option(help="The endpoint of every line.")] = (
        "/v1/chat/completions"
    ),
    window: Annotated[str, typer.Option(help="The completion window: 24h ... 168h.")] = "24h",
    metadata: Annotated[
        list[str] | None, typer.Option(help="key=value, repeatable.", show_default=False)
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="Watch it to the end, then save its files next to FILE.")
    ] = False,
    interval: Interval = 1.0,
) -> int:
    """Upload FILE and create a batch of it."""
    conn = _conn(ctx)
    meta = _metadata(metadata or [])
    with file.open("rb") as f:
        uploaded = conn.openai.files.create(file=(file.name, f), purpose="batch")
    batch = conn.openai.batches.create(
        input_file_id=uploaded.id,
        endpoint=cast(Any, endpoint),
        completion_window=cast(Any, window),
        metadata=meta or None,
    )
    out.print(f"Created {batch.id} from {file} ({uploaded.id})")
    if (estimate := _estimate(extension(batch))) is not None:
        out.print(f"Estimate: {estimate}")
    if not wait:
        return 0
    ended = _follow(conn, batch.id, interval)
    if ended is None:
        return 130
    return _ended(conn, ended, file.parent, file.stem)


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
    conn = _conn(ctx)
    if directory is not None:  # made now: a path that cannot be a directory fails before watching
        _make_dir(directory, "--download-to")
    ended = _follow(conn, batch_id, interval)
    if ended is None:
        return 130
    _say_how_it_ended(ended)
    if directory is not None:
        _download(conn, ended, directory, ended.id)
    return _exit_code(ended)


def _make_dir(directory: Path, option: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommandError(
            f"{option} {directory}: cannot make that directory ({e.strerror})."
        ) from None


@app.command("list")
def list_(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One Batch object per line.")] = False,
) -> int:
    """The newest batches."""
    page = _conn(ctx).openai.batches.list(limit=limit)
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
            _when(b.created_at),
            wait_reason(b),
        )
        for b in batches
    ]
    if not out.is_terminal:  # for scripts and logs: tab-separated, nothing cut
        for row in (header, *rows):
            print("\t".join(row))
        return 0
    table = Table(*header)
    table.columns[0].no_wrap = True
    for row in rows:
        table.add_row(*row)
    out.print(table)
    return 0


def _estimate(ext: dict[str, Any]) -> str | None:
    """The estimate at submit (`backfill.estimate`) in a line; None for a batch without one."""
    est = ext.get("estimate")
    if not isinstance(est, dict):
        return None
    ahead = f"{est.get('lines_ahead', 0)} lines queued before it"
    if est.get("window_achievable") is None:
        return f"none (no throughput history on its route); {ahead}"
    finish = est.get("expected_finish_at")
    when = f"expected to finish {_when(finish)}" if finish else "not expected within weeks"
    verdict = "window looks achievable" if est["window_achievable"] else "LIKELY TO MISS its window"
    return f"{when}, {verdict}; {ahead}"


def _when(ts: int | None) -> str:
    if not ts:
        return ""
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.command()
def get(
    ctx: typer.Context,
    batch_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="The Batch object as JSON.")] = False,
) -> int:
    """One batch: a readable summary, or --json."""
    batch = _conn(ctx).openai.batches.retrieve(batch_id)
    if as_json:
        print(batch.model_dump_json(indent=2))
        return 0
    ext = extension(batch)
    rows: list[tuple[str, Any]] = [
        ("status", batch.status + (" (paused)" if ext.get("paused") else "")),
        ("counts", _counts(batch)),
        ("endpoint", batch.endpoint),
        ("window", batch.completion_window),
        ("created", _when(batch.created_at)),
        ("expires", _when(batch.expires_at)),
    ]
    for name in ("completed_at", "failed_at", "expired_at", "cancelled_at"):
        if getattr(batch, name, None):
            rows.append((name.removesuffix("_at"), _when(getattr(batch, name))))
    if ext.get("paused") and batch.status == "in_progress":
        rows.append(("pace", "none while paused: lines move again once resumed"))
    elif ext.get("lines_per_second") is not None:
        finish = ext.get("expected_finish_at")
        pace = f"{ext['lines_per_second']} lines/s"
        pace += f", expected to finish {_when(finish)}" if finish else ", not moving"
        rows.append(("pace", pace + (" — AT RISK of expiring" if ext.get("at_risk") else "")))
    if (estimate := _estimate(ext)) is not None:
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
    out.print(_headline(_conn(ctx).openai.batches.cancel(batch_id)))
    return 0


@app.command()
def pause(ctx: typer.Context, batch_id: str) -> int:
    """Hold a batch's lines back until resumed (backfill extension)."""
    body = _conn(ctx).extension("POST", f"/batches/{batch_id}/pause")
    out.print(f"{batch_id} paused ({body.get('status')})")
    return 0


@app.command()
def resume(ctx: typer.Context, batch_id: str) -> int:
    """Let a paused batch's lines run again (backfill extension)."""
    body = _conn(ctx).extension("POST", f"/batches/{batch_id}/resume")
    out.print(f"{batch_id} resumed ({body.get('status')})")
    return 0


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
    conn = _conn(ctx)
    _make_dir(directory, "--dir")
    if partial:
        return _download_partial(conn, batch_id, directory)
    batch = conn.openai.batches.retrieve(batch_id)
    if batch.status not in TERMINAL:
        raise CommandError(
            f"{batch_id} is {batch.status}: its files exist once it ends. "
            "For what it has finished so far: --partial."
        )
    _download(conn, batch, directory, batch.id)
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
        page = conn.extension("GET", f"/batches/{batch_id}/results", **params)
        records: dict[str, list[str]] = {"output": [], "error": []}
        for item in page.get("data", []):
            records[item["file"]].append(json.dumps(item["record"], separators=(",", ":")))
        for kind, lines in records.items():
            if lines:
                with paths[kind].open("a") as f:
                    f.write("".join(line + "\n" for line in lines))
        new += len(page.get("data", []))
        after = page["next_after"]
        cursor_path.write_text(after + "\n")
        if not page.get("has_more") or not page.get("data"):
            break
    state = "more may come" if page.get("has_more") else "that is all of them"
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
    window: Annotated[str | None, typer.Option(help="Default: the original's.")] = None,
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
    conn = _conn(ctx)
    meta = _metadata(metadata or [])
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
    ended = _follow(conn, new.id, interval)
    if ended is None:
        return 130
    return _ended(conn, ended, directory, ended.id)


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
