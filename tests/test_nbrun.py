"""``poll_in_slices`` (sandbox_kernel.client.polling) keeps ``get_msg``'s contract, on a real
jupyter_client channel over a real zmq socket pair: the message when one comes (also
after several slices, and with no timeout), ``queue.Empty`` once the timeout has passed.

Why slices at all (a wake-up lost under load, the reply found only at nbclient's cell
timeout) is in the module's docstring; it needs a loaded machine to show, so the
notebook tests (tests/test_notebooks.py) run through :class:`NotebookRunner`.
"""

from __future__ import annotations

import asyncio
import queue

import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session
from sandbox_kernel.client.polling import poll_in_slices


async def _pair() -> tuple[zmq.asyncio.Context, zmq.asyncio.Socket, AsyncZMQSocketChannel, Session]:
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    session = Session(key=b"test-key")
    channel = AsyncZMQSocketChannel(dealer, session)
    poll_in_slices(channel, slice_s=0.2)
    return ctx, router, channel, session


async def _one_exchange(send_after_s: float, timeout: float | None) -> dict:
    ctx, router, channel, session = await _pair()
    try:
        session.send(channel.socket, "kernel_info_request", {})
        ident, *_ = await router.recv_multipart()

        async def reply() -> None:
            await asyncio.sleep(send_after_s)
            session.send(router, "kernel_info_reply", {"status": "ok"}, ident=[ident])

        task = asyncio.ensure_future(reply())
        msg = await channel.get_msg(timeout=timeout)
        await task
        return msg
    finally:
        channel.socket.close(linger=0)
        router.close(linger=0)
        ctx.term()


@pytest.mark.parametrize(("send_after_s", "timeout"), [(0.0, 5.0), (0.7, 5.0), (0.7, None)])
def test_the_message_comes_within_the_timeout_or_without_one(send_after_s, timeout):
    msg = asyncio.run(_one_exchange(send_after_s, timeout))
    assert (msg["msg_type"], msg["content"]) == ("kernel_info_reply", {"status": "ok"})


def test_nothing_within_the_timeout_is_empty():
    async def wait() -> None:
        ctx, router, channel, _ = await _pair()
        try:
            await channel.get_msg(timeout=0.5)
        finally:
            channel.socket.close(linger=0)
            router.close(linger=0)
            ctx.term()

    with pytest.raises(queue.Empty):
        asyncio.run(wait())
