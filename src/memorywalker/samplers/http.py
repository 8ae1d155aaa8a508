"""HTTP for the ``openai`` policy: one POST whose whole answer must arrive within a deadline.

urllib's ``timeout`` bounds each socket operation, so a server that sends ``Content-Length: 100000``
and then one byte a second keeps a request alive for a day. :func:`post_within` bounds the request as
a whole: a timer shuts the connection's socket down when the deadline passes, which ends any read in
progress, and the call raises ``TimeoutError``.
"""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port free on the loopback interface now (a race with other binders is possible, not likely)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ErrorAnswer(Exception):
    """An HTTP error answer, its body read within the deadline."""

    def __init__(self, code: int, reason: str, body: bytes):
        super().__init__(code, reason)
        self.code, self.reason, self.body = code, reason, body


def _tracking(handler: type) -> type:
    """``handler`` (urllib's HTTP or HTTPS handler) remembering the socket of every connection it opens."""

    class Tracking(handler):
        def __init__(self, sockets: list, **kwargs):
            super().__init__(**kwargs)
            self.sockets = sockets

        def do_open(self, http_class, req, **kwargs):
            sockets = self.sockets

            class Connection(http_class):
                def connect(self):
                    super().connect()
                    sockets.append(self.sock)

            return super().do_open(Connection, req, **kwargs)

    return Tracking


_TrackingHTTP, _TrackingHTTPS = _tracking(urllib.request.HTTPHandler), _tracking(urllib.request.HTTPSHandler)


def post_within(req: urllib.request.Request, seconds: float) -> bytes:
    """Send ``req`` and read its whole answer within ``seconds`` in all, or raise ``TimeoutError``.

    urllib's ``timeout`` bounds each socket operation only (a server sending one byte a second never
    trips it); here a timer shuts the connection's socket down when the deadline passes, which ends
    any read in progress. Proxies from the environment are used as by ``urlopen``. An HTTP error
    answer raises :class:`ErrorAnswer` with its body."""
    sockets: list[socket.socket] = []
    opener = urllib.request.build_opener(_TrackingHTTP(sockets), _TrackingHTTPS(sockets))
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        for s in list(sockets):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        try:
            with opener.open(req, timeout=seconds) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            if not expired.is_set():
                raise ErrorAnswer(e.code, str(e.reason), raw) from None
    except Exception:
        if expired.is_set():
            raise TimeoutError(f"timed out after {seconds:g} s") from None
        raise
    finally:
        timer.cancel()
    if expired.is_set():  # the socket was cut mid-body and the reader took the short body as the end
        raise TimeoutError(f"timed out after {seconds:g} s")
    return raw
