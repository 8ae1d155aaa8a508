"""Running the gateway: uvicorn in this thread or a background one, idle sessions finalized as it runs.

:class:`BackgroundServer` serves on a free port in a thread (tests, ``memorywalker harness run``, a
trainer that keeps the gateway beside it); :func:`serve_forever` is the CLI's foreground server.
Either way, stopping finalizes every open session into ``OUT/trajectories.jsonl``.
"""

from __future__ import annotations

import threading
import time

import uvicorn

from memorywalker.errors import InputError
from memorywalker.gateway.app import create_app
from memorywalker.gateway.core import Gateway
from memorywalker.samplers.http import free_port


def check_bind(host: str, api_key: str | None) -> None:
    """Only loopback without a key: anyone who reaches the port can spend the model and read nothing else."""
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        raise InputError(f"--host {host} exposes the gateway beyond this machine: give --api-key too")


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # a background thread cannot own signals
        pass


class BackgroundServer:
    """``with BackgroundServer(gateway) as url:`` serves until the block ends, then finalizes the sessions."""

    def __init__(self, gateway: Gateway, *, host: str = "127.0.0.1", port: int | None = None,
                 api_key: str | None = None, idle_s: float | None = None, on_call=None):
        check_bind(host, api_key)
        self.gateway, self.host, self.port = gateway, host, port or free_port()
        self.idle_s = idle_s
        config = uvicorn.Config(create_app(gateway, api_key=api_key, on_call=on_call), host=host, port=self.port,
                                log_level="warning", timeout_graceful_shutdown=5)
        self.server = _Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)
        self._reaper = threading.Thread(target=self._reap, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _reap(self) -> None:
        while not self.server.should_exit:
            time.sleep(1.0)
            if self.idle_s is not None:
                self.gateway.finalize_idle(self.idle_s)

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self.url}")
            time.sleep(0.02)
        self._reaper.start()
        return self.url

    def stop(self) -> int:
        """Stop serving; returns the number of trajectories the open sessions became."""
        self.server.should_exit = True
        self._thread.join(timeout=15)
        return self.gateway.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
