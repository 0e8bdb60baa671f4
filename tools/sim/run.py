"""Running the simulator: `SimServer` on loopback inside the current event loop (tests and
benches), and `main()`, the `backfill sim` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator

import uvicorn

from tools.sim.gpu import GpuConfig
from tools.sim.server import SimConfig, create_app


class _InProcessServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # leave the host process's signals alone
        yield


class SimServer:
    """Run the simulator on loopback in the current event loop (for tests and benchmarks)."""

    def __init__(self, config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.config = config or SimConfig()
        self.app = create_app(self.config)
        self.host, self.port = host, port
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio: NODELAY
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        cfg = uvicorn.Config(
            self.app,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            timeout_keep_alive=self.config.timeout_keep_alive_s,  # type: ignore[arg-type]
        )
        self._server = server = _InProcessServer(cfg)
        self._task = task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                sock.close()
                task.result()
                raise RuntimeError("simulator server exited during startup")
            await asyncio.sleep(0.002)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        engine = getattr(self.app, "engine", None)  # tests may serve another ASGI app
        if engine is not None:
            await engine.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5.0)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._server = self._task = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _serve_until_signal(server: uvicorn.Server) -> None:
    """SIGINT/SIGTERM stop the server gracefully (a second SIGINT forces); main then returns 0."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.handle_exit, sig, None)
    await server.serve()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="backfill sim", description="vLLM-like model server simulator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--model", action="append", dest="models", help="served model name (repeat)")
    p.add_argument("--any-model", action="store_true", help="accept any model name")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--latency-per-running-ms", type=float, default=0.0)
    p.add_argument("--stream-token-delay-ms", type=float, default=0.0)
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context in tokens (words): longer prompts and max_tokens get vLLM's 400",
    )
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("GPU mode", "continuous batching (tools.sim.gpu)")
    d = GpuConfig()
    g.add_argument("--gpu", action="store_true", help="continuous-batching engine model")
    g.add_argument("--step-base-ms", type=float, default=d.step_base_ms)
    g.add_argument("--step-per-seq-ms", type=float, default=d.step_per_seq_ms)
    g.add_argument("--prefill-per-token-ms", type=float, default=d.prefill_per_token_ms)
    g.add_argument("--kv-cache-tokens", type=int, default=d.kv_cache_tokens)
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    g.add_argument("--default-output-tokens", type=int, default=d.default_output_tokens)
    g.add_argument("--block-size", type=int, default=d.block_size, help="prefix cache's unit")
    g.add_argument("--no-prefix-caching", action="store_true", help="prefill every prompt in full")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--timeout-keep-alive",
        type=float,
        default=5.0,
        help="seconds before an idle keep-alive connection is closed (uvicorn's, default 5)",
    )
    args = p.parse_args(argv)
    config = SimConfig(
        model_names=[] if args.any_model else (args.models or ["demo"]),
        max_num_seqs=args.max_num_seqs,
        latency_ms=args.latency_ms,
        latency_per_running_ms=args.latency_per_running_ms,
        scheduling_policy=args.scheduling_policy,
        max_model_len=args.max_model_len,
        seed=args.seed,
        stream_token_delay_ms=args.stream_token_delay_ms,
        timeout_keep_alive_s=args.timeout_keep_alive,
        gpu=GpuConfig(
            step_base_ms=args.step_base_ms,
            step_per_seq_ms=args.step_per_seq_ms,
            prefill_per_token_ms=args.prefill_per_token_ms,
            kv_cache_tokens=args.kv_cache_tokens,
            max_num_batched_tokens=args.max_num_batched_tokens,
            default_output_tokens=args.default_output_tokens,
            block_size=args.block_size,
            prefix_caching=not args.no_prefix_caching,
        )
        if args.gpu
        else None,
    )
    cfg = uvicorn.Config(
        create_app(config),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=config.timeout_keep_alive_s,  # type: ignore[arg-type]
    )
    asyncio.run(_serve_until_signal(_InProcessServer(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
