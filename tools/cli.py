"""The `backfill` command (also `python -m tools`).

    backfill dev              dev server + simulator + worker + api (what `make run` runs)
    backfill api              the HTTP api (uvicorn), settings from backfill.toml + env
    backfill worker           the Temporal worker
    backfill sim [args...]    the vLLM-like simulator (args go to tools.sim.main)
    backfill batch ...        the client CLI: submit, watch, retry... (tools/client, docs/cli.md)
    backfill doctor           check a deployment (Temporal, search attributes, routes...) and say
                              what to fix (docs/upgrading.md)
    backfill hash-key         the SHA-256 of a key read from stdin, for [[api_keys]]
    backfill keys create --workspace W --role R [--models m1,m2] [--name N]
                              a new random key (printed once) and its [[api_keys]] entry

Logging is configured here and only here (level from BACKFILL_LOG_LEVEL, default INFO; one JSON
object per line with BACKFILL_LOG_FORMAT=json, see backfill/platform/logs.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backfill.platform.config import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    name = os.environ.get("BACKFILL_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    level = logging.getLevelNamesMapping().get(name)
    logging.basicConfig(level=level if level is not None else logging.INFO, format=LOG_FORMAT)
    log_format = os.environ.get("BACKFILL_LOG_FORMAT", "text").strip().lower()
    if log_format == "json":
        from temporalio import activity, workflow

        from backfill.platform.logs import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
        # The workflow's or activity's ids are fields of their own: not repeated in the message.
        workflow.logger.workflow_info_on_message = False
        activity.logger.activity_info_on_message = False
    if level is None or level > logging.DEBUG:
        # httpx logs every request at INFO (each upstream call, each health poll): too chatty.
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    # Audit events are always recorded, whatever the level asked for.
    logging.getLogger("backfill.audit").setLevel(logging.INFO)
    if level is None:
        logging.getLogger("backfill").warning(
            "BACKFILL_LOG_LEVEL=%r is not a log level; using INFO", name
        )
    if log_format not in ("text", "json"):
        logging.getLogger("backfill").warning(
            "BACKFILL_LOG_FORMAT=%r is neither text nor json; using text", log_format
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backfill", description="OpenAI-compatible Batch API gateway on Temporal."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dev = sub.add_parser("dev", help="run the dev server, simulator, worker and api (make run)")
    dev.add_argument(
        "--temporal-address",
        default=None,
        metavar="HOST:PORT",
        help="use this running Temporal instead of starting a dev server (TEMPORAL_ADDRESS set "
        "does the same); its missing search attributes are registered",
    )
    dev.add_argument(
        "--temporal-port", type=int, default=None, help="the embedded dev server's (7233)"
    )
    dev.add_argument("--ui-port", type=int, default=None, help="the embedded dev server's (8233)")
    dev.add_argument(
        "--sim-port",
        type=int,
        default=8100,
        help="the simulator is started here for the routes whose base_url names this port "
        "(backfill.toml's demo-sim: 8100); a route at another port of this machine needs its "
        "model server running",
    )
    dev.add_argument(
        "--api-port", type=int, default=None, help="default: api_port from the settings (8000)"
    )
    dev.add_argument(
        "--worker-metrics-port",
        type=int,
        default=None,
        help="the worker's /metrics (and preemption channel); default: worker_metrics_port "
        "from the settings (9464)",
    )
    sub.add_parser("api", help="serve the HTTP api")
    sub.add_parser(
        "doctor", help="check a deployment from its settings and say what to fix (exit 1 if any)"
    )
    sub.add_parser("worker", help="run the Temporal worker")
    sub.add_parser("sim", help="run the vLLM-like simulator (backfill sim --help)", add_help=False)
    sub.add_parser(
        "batch", help="submit and manage batches (backfill batch --help)", add_help=False
    )
    sub.add_parser(
        "hash-key",
        help="print the SHA-256 of an API key read from standard input, for backfill.toml",
    )
    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_command", required=True, metavar="KEYS_COMMAND"
    )
    create = keys.add_parser(
        "create", help="print a new random key once, and the [[api_keys]] entry to add"
    )
    create.add_argument("--workspace", required=True)
    create.add_argument("--role", required=True, choices=["member", "platform_admin", "auditor"])
    create.add_argument("--models", default=None, help="comma-separated models (default: all)")
    create.add_argument("--name", default="", help="a label shown in logs and paused_by")
    return parser


def _create_key(workspace: str, role: str, models: str | None, name: str) -> int:
    from pydantic import ValidationError

    from backfill.tenancy.keys import create_key, parse_models

    try:
        new = create_key(workspace, role, parse_models(models), name)  # type: ignore[arg-type]
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()
        )
        print(f"backfill keys create: {problems}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"backfill keys create: {e}", file=sys.stderr)
        return 2
    print(f"New API key (shown only this once; backfill stores only its hash):\n\n  {new.key}\n")
    print("Add this entry to the [[api_keys]] of your backfill.toml, then restart the api:\n")
    print(new.toml(), end="")
    return 0


def _load_settings() -> Settings | None:
    from backfill.platform.config import ConfigError, load_settings

    try:
        return load_settings()
    except ConfigError as e:
        print(f"backfill: {e}", file=sys.stderr)
        return None


def _missing(e: ModuleNotFoundError, module: str) -> bool:
    return e.name is not None and (e.name == module or module.startswith(e.name + "."))


def _serve(command: str, settings: Settings) -> int:
    """`backfill api` / `backfill worker`: run the process until a signal stops it."""
    # Named imports, not a module loaded by name: the linter sees that the command (the tools
    # layer) sits above the api and the worker.
    if command == "api":
        from api.main import run
    else:
        from worker.main import run
    try:
        run(settings)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)

    # The simulator parses its own arguments (argparse subparsers mangle option-first remainders).
    if args_list and args_list[0] == "sim":
        configure_logging()
        try:
            from tools.sim import main as run_sim
        except ModuleNotFoundError as e:
            if not _missing(e, "tools.sim"):
                raise
            print(f"backfill sim: the simulator is not available ({e})", file=sys.stderr)
            return 1
        try:
            return run_sim(args_list[1:])
        except KeyboardInterrupt:
            return 130

    if args_list and args_list[0] == "batch":  # the client CLI parses its own arguments
        from tools.client import main as run_client

        return run_client(args_list[1:])

    args = _parser().parse_args(args_list)

    if args.command == "hash-key":
        from backfill.platform.config import hash_key

        # From standard input: a key on the command line lands in shell history and `ps`.
        if sys.stdin.isatty():
            import getpass

            key = getpass.getpass("API key: ").strip()
        else:
            key = sys.stdin.readline().strip()
        if not key:
            print("backfill hash-key: no key on standard input", file=sys.stderr)
            return 2
        print(hash_key(key))
        return 0

    if args.command == "keys":
        return _create_key(args.workspace, args.role, args.models, args.name)

    configure_logging()
    settings = _load_settings()
    if settings is None:
        return 2

    if args.command == "dev":
        from tools.dev import runner
        from tools.dev.devserver import DEFAULT_PORT, DEFAULT_UI_PORT

        embedded_only = [
            flag
            for flag, value in (
                ("--temporal-port", args.temporal_port),
                ("--ui-port", args.ui_port),
            )
            if value is not None
        ]
        if args.temporal_address and embedded_only:
            print(
                f"backfill dev: {' and '.join(embedded_only)} are the embedded dev server's; "
                "with --temporal-address none is started",
                file=sys.stderr,
            )
            return 2
        return runner.run(
            settings,
            temporal_port=args.temporal_port or DEFAULT_PORT,
            ui_port=args.ui_port or DEFAULT_UI_PORT,
            sim_port=args.sim_port,
            api_port=args.api_port,
            worker_metrics_port=args.worker_metrics_port,
            temporal_address=args.temporal_address,
        )

    if args.command == "doctor":
        from backfill.operations import doctor

        code = doctor.run(settings)
        # Everything is printed: leave without finalizing the interpreter, whose shutdown can
        # abort (SIGABRT, "PyGILState_Release") while the Temporal client's native threads still
        # run, turning an all-green report into exit -6.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    if args.command == "api":
        from backfill.platform.config import UnsafeConfig, check_exposure

        try:
            check_exposure(settings)
        except UnsafeConfig as e:
            print(f"backfill api: refusing to start: {e}", file=sys.stderr)
            return 2
    if args.command in ("api", "worker"):
        return _serve(args.command, settings)

    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others
