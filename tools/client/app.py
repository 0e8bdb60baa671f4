"""The `backfill batch` command's typer app and what its commands share: the connection, the
consoles, following a batch to its end, saving its files and saying how it ended. The commands
are `tools.client.commands` (submit, watch, list, get, controls) and `tools.client.results`
(download, retry)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer
from openai.types import Batch
from rich.console import Console

from backfill.batches.batch import COMPLETION_WINDOWS
from tools.client.connection import DEFAULT_BASE_URL, CommandError, Connection
from tools.client.watching import watch
from tools.client.wording import headline, input_errors

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


def conn_of(ctx: typer.Context) -> Connection:
    """The command's connection, made when a command first needs the server (so `--help` and
    refused options need no key)."""
    root = ctx.find_root()
    if isinstance(root.obj, Connection):
        return root.obj
    import os

    key = os.environ.get("OPENAI_API_KEY", "").strip()
    if not key:
        raise CommandError("Set OPENAI_API_KEY to your API key.")
    conn = Connection(cast(str, root.obj), key)
    root.obj = conn
    root.call_on_close(conn.close)
    return conn


@app.callback()
def connect(
    ctx: typer.Context,
    base_url: Annotated[
        str, typer.Option("--base-url", envvar="OPENAI_BASE_URL", help="The server's /v1 URL.")
    ] = DEFAULT_BASE_URL,
) -> None:
    ctx.obj = base_url  # the connection is made by `conn_of`, when a command needs it


def check_window(window: str | None) -> str | None:
    """A completion window the server accepts, checked before anything is uploaded."""
    if window is not None and window not in COMPLETION_WINDOWS:
        raise typer.BadParameter(
            f"{window!r} is not a completion window: one of {', '.join(COMPLETION_WINDOWS)}"
        )
    return window


def metadata_of(pairs: list[str]) -> dict[str, str]:
    meta = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not key=value", param_hint="--metadata")
        meta[key] = value
    return meta


def exit_code(batch: Batch) -> int:
    return 0 if batch.status == "completed" else 1


def follow(conn: Connection, batch_id: str, interval: float) -> Batch | None:
    """Watch until the batch ends; None when the user stopped watching (Ctrl-C)."""
    try:
        return watch(lambda: conn.openai.batches.retrieve(batch_id), out, interval)
    except KeyboardInterrupt:
        err.print(
            f"Stopped watching. {batch_id} goes on; watch it again with: backfill batch watch "
            f"{batch_id}"
        )
        return None


def save_files(conn: Connection, batch: Batch, directory: Path, stem: str) -> list[Path]:
    saved = []
    for label, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id)):
        if file_id:
            path = directory / f"{stem}.{label}.jsonl"
            conn.openai.files.content(file_id).write_to_file(path)
            saved.append(path)
    for path in saved:
        out.print(f"Saved {path}")
    return saved


def report_end(conn: Connection, batch: Batch, directory: Path, stem: str) -> int:
    say_how_it_ended(batch)
    save_files(conn, batch, directory, stem)
    return exit_code(batch)


def say_how_it_ended(batch: Batch) -> None:
    """The headline, and for a batch whose input was refused, each reason (there are no lines
    and no files to look at: the reasons are all there is)."""
    out.print(headline(batch))
    for e in input_errors(batch):
        err.print(f"  {e}", markup=False)


def make_dir(directory: Path, option: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CommandError(
            f"{option} {directory}: cannot make that directory ({e.strerror})."
        ) from None
