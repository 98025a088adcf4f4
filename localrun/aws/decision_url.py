"""The approvals decision URL, served on this machine's loopback while the local platform runs.

In AWS the decision URL is a Lambda function URL; here an HTTP server on 127.0.0.1 hands each request
to the ApprovalDecide handler as the function URL would (method, headers, query, body), so that `tp
pending|approve|reject` in another terminal decides a local run's gates as it decides a deployed one's.
Only loopback is served: the credentials it accepts are the local platform's, and no one else's.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

HOST = "127.0.0.1"


def function_url_event(method: str, headers: dict[str, str], query: str, body: bytes | None) -> dict[str, Any]:
    """The event a Lambda function URL delivers for an HTTP request (payload 2.0, the fields the handler reads)."""
    parameters = dict(urllib.parse.parse_qsl(query)) if query else None
    return {
        "requestContext": {"http": {"method": method}},
        "headers": {k.lower(): v for k, v in headers.items()},
        "queryStringParameters": parameters,
        "body": body.decode() if body is not None else None,
    }


class Platform(Protocol):
    """What the server needs of the local platform (localrun/aws/engine.py's LocalPlatform)."""

    def invoke(self, function: str, event: Any) -> Any: ...


class DecisionUrl:
    """A loopback HTTP server delivering to the platform's ApprovalDecide handler; `decided` lists its decisions."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.decided: list[dict[str, Any]] = []
        self.announced: set[str] = set()
        """The requests whose instructions the demo has printed."""
        self._lock = threading.Lock()
        served = self

        class Handler(BaseHTTPRequestHandler):
            def _deliver(self) -> None:
                query = urllib.parse.urlsplit(self.path).query
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                event = function_url_event(self.command, dict(self.headers.items()), query, body)
                response = served.platform.invoke("ApprovalDecide", event)
                status, text = int(response["statusCode"]), str(response["body"])
                if self.command == "POST" and status == 200:
                    with served._lock:
                        served.decided.append(json.loads(text))
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(text.encode())))
                self.end_headers()
                self.wfile.write(text.encode())

            do_GET = _deliver  # noqa: N815 - http.server's naming
            do_POST = _deliver  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                """The demo's terminal shows decisions, not an access log."""

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}/"

    def take_decisions(self) -> list[dict[str, Any]]:
        """The decisions made through the server since the last call."""
        with self._lock:
            taken, self.decided = self.decided, []
        return taken

    def __enter__(self) -> DecisionUrl:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
