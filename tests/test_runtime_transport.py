"""The phase-1 tasks' transport (``transport.py``) alone: both socket kinds, and its system calls.

A peer on the same host is reached through a Unix socket, any other over TCP;
both carry the same frames.  The frame and poll path is the crossing
transactions' per-round cost, so what it asks of the kernel is checked too.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from txstream.spark.runtime import transport as transport_module
from txstream.spark.runtime.transport import SocketTransport, new_exchange


def _pair(tmp_path: Path) -> tuple[SocketTransport, SocketTransport]:
    exchange = new_exchange(2)
    receiver = SocketTransport(0, 2, tmp_path, exchange["secret"], "127.0.0.1")
    sender = SocketTransport(1, 2, tmp_path, exchange["secret"], "127.0.0.1")
    return receiver, sender


def _welcomed(receiver: SocketTransport, sender: SocketTransport) -> list[Any]:
    """Connect ``sender`` to ``receiver`` with one message; what arrived."""
    sender.send(0, (0, 1, [("hello",)]))
    got: list[Any] = []
    for _ in range(200):
        sender.flush()
        got += receiver.poll(0.01)
        sender.poll(0.0)
        if 0 in sender.welcomed and got:
            break
    assert 0 in sender.welcomed
    return got


@pytest.mark.parametrize("kind", ["local", "tcp"])
def test_frames_small_and_larger_than_the_buffer_arrive_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    if kind == "tcp":  # (as between hosts: no local socket published)
        monkeypatch.setattr(transport_module, "_local_server", lambda: None)
    receiver, sender = _pair(tmp_path)
    try:
        assert _welcomed(receiver, sender) == [(0, 1, [("hello",)])]
        family = sender.outgoing[0].family
        assert family == (socket.AF_UNIX if kind == "local" else socket.AF_INET)
        big = "y" * (3 * transport_module.INBOX_BYTES)  # (the inbox grows for it)
        sent = [(0, 1, [(i, "x" * (i % 50))]) for i in range(300)]
        sent.insert(150, (0, 1, [(-1, big)]))
        for message in sent:
            sender.send(0, message)
            if len(sender.queued.get(0, ())) % 7 == 0:
                sender.flush()  # (frames of several sizes, some split across reads)
        got: list[Any] = []
        for _ in range(500):  # (one thread: the receiver reads while the sender writes)
            sender.flush()
            got += receiver.poll(0.01)
            if len(got) == len(sent):
                break
        assert got == sent
        assert receiver.frames_received == sender.frames_sent
    finally:
        sender.close()
        receiver.close()


def test_a_peer_whose_local_socket_is_elsewhere_is_reached_over_tcp(tmp_path: Path) -> None:
    # A peer on another host publishes a local name that does not exist here.
    receiver, sender = _pair(tmp_path)
    try:
        path = tmp_path / "t0.addr"
        address = json.loads(path.read_text())
        path.write_text(json.dumps({**address, "local": "txstream-not-on-this-host"}))
        assert _welcomed(receiver, sender) == [(0, 1, [("hello",)])]
        assert sender.outgoing[0].family == socket.AF_INET
    finally:
        sender.close()
        receiver.close()


def test_a_frame_costs_one_send_and_a_poll_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Per frame: one send, nothing else asked of the sending socket (a lookup that
    # missed the selector's map used to format the socket's repr: getsockname and
    # getpeername); per readable socket, one read when it took all there was (not a
    # second one to meet EAGAIN).
    receiver, sender = _pair(tmp_path)
    calls: list[str] = []
    original_recv_into = socket.socket.recv_into

    def recv_into(self: socket.socket, *args: Any) -> int:
        calls.append("recv_into")
        return original_recv_into(self, *args)

    def refused_repr(self: socket.socket) -> str:
        raise AssertionError("a socket's repr was formatted (two system calls)")

    try:
        _welcomed(receiver, sender)
        monkeypatch.setattr(socket.socket, "recv_into", recv_into)
        monkeypatch.setattr(socket.socket, "__repr__", refused_repr)
        for i in range(5):
            sender.send(0, (0, 1, [(i,)]))
            sender.flush()
            got = receiver.poll(1.0)
            assert got == [(0, 1, [(i,)])]
        assert calls == ["recv_into"] * 5
    finally:
        monkeypatch.undo()
        sender.close()
        receiver.close()
