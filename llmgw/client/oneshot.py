"""Requests of a short-lived client without aiohttp: the CLI's verbs (Client(oneshot=True)).

Importing aiohttp costs a command ~100 ms, more than any of its requests: ~40 ms of it are the
two default SSL contexts aiohttp makes at import (aio-libs/aiohttp#3080), which llmgw, dialing
with its own CA, never uses. A verb makes a few requests one after another and exits, so the
standard library's http.client, on a worker thread, serves it as well. Watches and followed
logs, which stream, still go through aiohttp (imported when the first one starts).

Each request holds a connection of its own while it runs; connections are kept open between
requests, and one that the server closed while idle is replaced, as urllib3 does.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import ssl
from typing import Any
from urllib.parse import urlencode, urlsplit


class Answer:
    def __init__(self, status: int, reason: str, text: str) -> None:
        self.status, self.reason, self.text = status, reason, text


class OneShot:
    def __init__(self, server: str, context: ssl.SSLContext | None, timeout: float) -> None:
        url = urlsplit(server)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "127.0.0.1", url.port
        self._context, self._timeout = context, timeout
        self._idle: list[http.client.HTTPConnection] = []

    async def request(self, method: str, path: str, params: dict[str, str], body: Any,
                      timeout: float | None = None) -> Answer:
        """``timeout``: this request's, instead of the client's."""
        target = f"{path}?{urlencode(params)}" if params else path
        data = None if body is None else json.dumps(body).encode()
        return await asyncio.to_thread(self._request, method, target, data, timeout or self._timeout)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout, context=self._context)
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def _request(self, method: str, target: str, data: bytes | None, timeout: float) -> Answer:
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            conn, reused = self._idle.pop(), True   # requests on other threads may take them too
        except IndexError:
            conn, reused = self._connection(), False
        conn.timeout = timeout   # a new connection's connect, and (below) a kept one's socket
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
            answer = Answer(resp.status, resp.reason, resp.read().decode("utf-8", "replace"))
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            # (RemoteDisconnected is a ConnectionResetError; on TLS, a closed connection is an SSLEOFError)
            conn.close()
            if not reused:
                raise   # a new connection: the error says why (a TLS refusal, say)
            return self._request(method, target, data, timeout)   # closed while idle: once more, on a new one
        except http.client.HTTPException as err:
            conn.close()
            raise ConnectionError(f"not an HTTP answer: {err!r}") from None
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._idle.append(conn)
        return answer
