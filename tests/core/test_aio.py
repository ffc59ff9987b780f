"""llmgw.aio: how the services' event loop runs."""
from __future__ import annotations

import asyncio
import logging

from llmgw import aio


async def _report(closed: bool) -> None:
    """A real TCP connection's transport (closed or not) in the context uvloop's TLS reports a
    write to a closed transport with."""
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    if closed:
        writer.close()
    loop.call_exception_handler({
        "message": "Fatal error on SSL protocol", "transport": writer.transport,
        "exception": RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")})
    if not closed:
        writer.close()
    server.close()


def test_a_tls_connection_cut_while_read_is_one_quiet_line(caplog):
    with caplog.at_level(logging.DEBUG):
        aio.run(_report(closed=True))
    assert [r.levelno for r in caplog.records if "TLS" in r.getMessage()] == [logging.DEBUG]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_same_error_on_a_live_connection_is_reported_in_full(caplog):
    aio.run(_report(closed=False))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None   # the default handler: its traceback
