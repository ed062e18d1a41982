"""What the demo runs inside its own process besides the clients: the proxy on an event loop
in a background thread, and the proxy's and the clients' logs caught in a ring buffer for the
live view and for a failure report."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from kafka_quota_proxy.config import Settings

log = logging.getLogger("kafka_quota_proxy.demo")


class ProxyThread:
    """The proxy, in this process, on its own event loop in a background thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._run, name="proxy", daemon=True)
        self.proxy: Any = None
        self.stopped = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        from kafka_quota_proxy.proxy.server import Proxy

        self.thread.start()

        async def start() -> Any:
            proxy = Proxy(self.settings)
            await proxy.start()
            return proxy

        self.proxy = self._call(start(), 10.0)

    async def _shutdown(self) -> None:
        if self.proxy is not None:
            await self.proxy.shutdown()
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not current]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def stop(self) -> None:
        if not self.thread.is_alive():
            self.stopped = True
            return
        try:
            self._call(self._shutdown(), self.settings.shutdown_timeout_seconds + 5.0)
        except Exception as exc:  # keep cleaning up: the thread is a daemon and dies with us
            log.warning("proxy shutdown: %s", exc or type(exc).__name__)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()
            self.stopped = True


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class RingHandler(logging.Handler):
    """Keeps the last log lines (proxy and clients) for the view and for a failure report."""

    def __init__(self, keep: int = 200) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=keep)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                            "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record).replace("\n", " "))
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def captured_logs(to_stderr: bool) -> Iterator[RingHandler]:
    """Route the proxy's and the clients' logs into a ring buffer (and, when there is no live
    view to show them, warnings and worse to stderr); put the loggers back afterwards."""
    ring = RingHandler()
    names = ("kafka_quota_proxy", "kqp_demo.clients")
    saved = []
    for name in names:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate, list(logger.handlers)))
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.handlers = [ring]
        if to_stderr:
            err = logging.StreamHandler(sys.stderr)
            err.setLevel(logging.WARNING)
            err.setFormatter(ring.formatter)
            logger.addHandler(err)
    try:
        yield ring
    finally:
        for logger, level, propagate, handlers in saved:
            logger.setLevel(level)
            logger.propagate = propagate
            logger.handlers = handlers
