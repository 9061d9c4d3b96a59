"""A client's message limit against real node processes (TLS as `floe up` sets it
up): a reply over the client's `max_message_bytes` and a request over the node's
limit each fail their call TooLarge, naming the side that refused it, the size and
the limit; a limit that is not a size is refused when the client is made."""

from __future__ import annotations


import pytest

from floering.mapper import AsyncRingClient, RingClient


@pytest.mark.parametrize("limit", [0, -1, 1 << 31, 8.0, "8388608", True, None])
def test_a_limit_that_is_not_a_size_is_refused_when_the_client_is_made(limit):
    for make in (RingClient, AsyncRingClient):
        with pytest.raises(ValueError, match="max_message_bytes must be"):
            make(["127.0.0.1:1"], max_message_bytes=limit)
