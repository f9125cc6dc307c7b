"""The Request that user code receives on the realtime route (the exchange replays it): its body is the one
already read, and it tells a cancelled call."""

from __future__ import annotations

import asyncio

from modelserve.context import RequestContext
from modelserve.http.exchange import replayed_request as _request_with_body

SCOPE = {"type": "http", "method": "POST", "path": "/m", "headers": [], "query_string": b""}


def test_looking_for_a_disconnect_leaves_the_body_to_read() -> None:
    async def scenario() -> tuple[bool, bytes, bool, bool]:
        ctx = RequestContext("m", "r1")
        request = _request_with_body(SCOPE, b'{"a": 1}', ctx)
        before = await request.is_disconnected()
        body = await request.body()
        still = await request.is_disconnected()
        ctx.cancel("disconnect")  # what the watch does under on_disconnect: notify
        return before, body, still, await request.is_disconnected()

    assert asyncio.run(scenario()) == (False, b'{"a": 1}', False, True)


def test_a_request_of_a_cancelled_call_is_disconnected_at_once() -> None:
    async def scenario() -> bool:
        ctx = RequestContext("m", "r2")
        ctx.cancel("disconnect")
        return await _request_with_body(SCOPE, b"", ctx).is_disconnected()

    assert asyncio.run(scenario()) is True
