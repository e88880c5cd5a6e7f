"""Run ``vllm-dartree serve`` as a child process on 127.0.0.1 (tests, demo, benchmarks)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_dartree.env import apply_process_defaults, cache_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_json(url: str, payload: dict | None = None, timeout: float = 120.0) -> dict:
    """GET (payload None) or POST JSON to a loopback URL and decode the JSON answer."""
    assert url.startswith("http://127.0.0.1:"), url  # loopback only, by construction
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read().decode()
    return json.loads(body) if body.strip().startswith(("{", "[")) else {"text": body}


def metric_value(metrics_text: str, name: str) -> float | None:
    """The value of Prometheus sample ``name`` (any labels) in a ``/metrics`` page, or None."""
    pattern = rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$"
    match = re.search(pattern, metrics_text, re.M)
    return float(match.group(1)) if match else None


def http_text(url: str, timeout: float = 30.0) -> str:
    assert url.startswith("http://127.0.0.1:"), url
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def completion_text(base: str, body: dict, timeout: float = 120.0) -> str:
    """The text of one completion (``prompt`` in ``body``) or chat answer (``messages``)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    choice = http_json(base + path, body, timeout)["choices"][0]
    return choice.get("text", choice.get("message", {}).get("content"))


def stream_and_hang_up(base: str, body: dict, max_tokens: int, timeout: float = 120.0) -> bool:
    """Stream ``body``, read the first chunk, hang up (the server must abort the request);
    whether a first chunk came."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    host, port = base.removeprefix("http://").split(":")
    assert host == "127.0.0.1", base  # loopback only
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, json.dumps(body | {"stream": True, "max_tokens": max_tokens}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = response.readline()
    conn.close()
    return response.status == 200 and first.startswith(b"data:")


@contextmanager
def running_server(
    model: str | Path, *extra_args: str, served_name: str = "tiny", startup_timeout: float = 240.0,
    log_name: str = "server.log", env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Start the OpenAI server; yield its base URL; stop it (and its engine) afterwards.
    ``env`` adds environment variables for the server's processes."""
    apply_process_defaults()
    port = free_port()
    log_path = cache_dir() / "logs" / log_name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "vllm_dartree.cli", "serve", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name,
        *extra_args,
    ]
    env = dict(os.environ) | (env or {})
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its normal process tree
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {proc.returncode}; last log lines:\n"
                    + "\n".join(log_path.read_text().splitlines()[-30:])
                )
            try:
                http_text(base + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server not healthy after {startup_timeout}s") from None
                time.sleep(1)
        yield base
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
