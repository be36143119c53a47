"""The transport between the phase-1 tasks of one barrier stage: framed messages over sockets.

:mod:`.forward`'s partitions exchange rows and answers in rounds; a round's
messages for another task go through a :class:`SocketTransport`, which frames
them, connects to the peer the first time (addresses published as files of the
store), proves the batch's secret, and never blocks on a write.

Ownership: a transport belongs to one task's :class:`~.forward.ForwardScheduler`
and is used from its thread only.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import secrets
import selectors
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txstream.spark.runtime.errors import ExchangeError

EXCHANGE_TIMEOUT_S = 600.0
"""How long a task tries to reach a peer, or to send it its bytes, before giving up."""

Message = tuple[int, int, list[tuple[Any, ...]]]
"""(destination partition, source partition, messages): what one partition sent
another in one round, each a flat tuple laid out as :mod:`.forward.messages` says."""

_HEADER = struct.Struct("!I")
_HELLO = struct.Struct("!32sII")
"""A connection's first bytes: the batch's secret, the sender's task and the receiver's."""
_WELCOME = b"+"
INBOX_BYTES = 1 << 18
"""An incoming socket's buffer (grown for a larger frame): a round's frame is a few KB."""
FLUSH_AT = 256
"""Messages buffered for one task before they go out without waiting for a flush."""


def new_exchange(tasks: int) -> dict[str, Any]:
    """A batch attempt's exchange settings: a secret that peers prove, and the task count."""
    return {"secret": secrets.token_hex(16), "tasks": tasks}


def _local_server() -> socket.socket | None:
    """A listening Unix socket in Linux's abstract namespace, for peers on this host.

    A frame over loopback TCP goes through the whole TCP/IP stack twice (the
    data, then its acknowledgement); over a Unix socket it is a copy into the
    peer's queue, which halves a send's system time.  The name is random and
    lives in this network namespace only, so a peer elsewhere fails to connect to
    it and uses the TCP address.  None where there is no abstract namespace.
    """
    if not sys.platform.startswith("linux"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(b"\0txstream-" + secrets.token_hex(16).encode())
        sock.listen()
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _local_connection(name: str | None) -> socket.socket | None:
    """A connection to a peer's :func:`_local_server` named ``name``, if it is on this host."""
    if not name or not sys.platform.startswith("linux"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(b"\0" + name.encode())
    except OSError:  # (another host's task, or a stale address: TCP decides)
        sock.close()
        return None
    return sock


class _Inbox:
    """What arrived on one incoming socket and is not unpickled yet.

    A buffer read into in place (``recv_into``: no bytes object per read, no
    copy into the buffer), of which ``filled`` bytes hold data; it grows only
    for a frame larger than itself.
    """

    __slots__ = ("buffer", "filled")

    def __init__(self) -> None:
        self.buffer = bytearray(INBOX_BYTES)
        self.filled = 0

    def consumed(self, offset: int) -> None:
        """The first ``offset`` bytes were read: move the rest to the front."""
        if offset:
            rest = self.filled - offset
            if rest:
                self.buffer[:rest] = self.buffer[offset : self.filled]
            self.filled = rest

    def make_room(self) -> None:
        """After :meth:`consumed`: grow a full buffer (a frame larger than it)."""
        if self.filled == len(self.buffer):
            self.buffer.extend(bytes(len(self.buffer)))


class SocketTransport:
    """Messages between the tasks of one barrier stage, over TCP or, on one host, Unix sockets.

    Each task listens on a port of its own (and on a Unix socket, see
    :func:`_local_server`) and publishes its address as a file
    in ``folder`` (in the store, which every task can read, as the event-time
    frontier's exchange does); a task connects to a peer the first time it has
    a message for it and proves the batch's secret before anything else is
    read.  Messages are pickled in frames (the peers are this job's own tasks,
    and a connection that does not know the secret is closed unread).  Sockets
    do not block: a task keeps reading while its own writes wait, so two tasks
    that send to each other at once cannot wedge.
    """

    def __init__(
        self,
        me: int,
        tasks: int,
        folder: Path,
        secret: str,
        host: str,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self.me = me
        self.cancelled = cancelled
        """Says when another task failed (threads in one process; Spark kills a barrier
        stage's tasks itself)."""
        self.tasks = tasks
        self.folder = folder
        self.secret = secret.encode()
        self.selector = selectors.DefaultSelector()
        self.server = socket.create_server(("", 0))
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, self.server)
        address: dict[str, Any] = {"host": host, "port": self.server.getsockname()[1]}
        self.local = _local_server()
        if self.local is not None:
            self.selector.register(self.local, selectors.EVENT_READ, self.local)
            address["local"] = self.local.getsockname()[1:].decode()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".t{me}.tmp"
        tmp.write_text(json.dumps(address))
        os.replace(tmp, folder / f"t{me}.addr")  # peers see all of it or nothing
        self.outgoing: dict[int, socket.socket] = {}
        self.welcomed: set[int] = set()
        self.connecting: dict[int, float] = {}
        """When the first connection to each peer not yet welcomed was tried."""
        self.queued: dict[int, list[Message]] = {}
        self.unsent: dict[int, bytearray] = {}
        self.writing: set[int] = set()
        """Peers whose socket is registered for writing (bytes wait for room)."""
        self.incoming: dict[socket.socket, _Inbox] = {}
        self.verified: set[socket.socket] = set()
        self.arrived: list[Message] = []
        self.bytes_sent = 0
        self.frames_sent = 0
        """Frames (pickled lists of messages) sent, and received: measures."""
        self.frames_received = 0

    def send(self, task: int, message: Message) -> None:
        """Queue ``message`` for ``task``; it goes out at the next flush (or when many wait)."""
        queue = self.queued.setdefault(task, [])
        queue.append(message)
        if len(queue) >= FLUSH_AT:
            self._frame(task)
            self._write(task)

    def flush(self, wait: bool = False) -> None:
        """Send what is queued; with ``wait``, until every byte is out."""
        for task in list(self.queued):
            if self.queued[task]:
                self._frame(task)
        for task in list(self.unsent):
            self._write(task)
        deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
        while wait and any(self.unsent.values()):
            if time.monotonic() > deadline:
                raise ExchangeError(f"task {self.me} could not send its messages")
            self._select(0.01)
            for task in list(self.unsent):
                self._write(task)

    def _frame(self, task: int) -> None:
        body = pickle.dumps(self.queued[task], protocol=pickle.HIGHEST_PROTOCOL)
        self.queued[task] = []
        buffer = self.unsent.setdefault(task, bytearray())
        buffer += _HEADER.pack(len(body))
        buffer += body
        self.bytes_sent += len(body) + _HEADER.size
        self.frames_sent += 1

    def _write(self, task: int) -> None:
        buffer = self.unsent.get(task)
        if not buffer:
            return
        if task not in self.welcomed:
            if task not in self.outgoing:
                self._connect(task)
            return  # (the welcome's arrival writes)
        sock = self.outgoing[task]
        try:
            sent = sock.send(buffer)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise ExchangeError(
                f"task {self.me} lost its connection to task {task}: {exc}"
            ) from None
        del buffer[:sent]
        # Registered for writing only while bytes wait.  (Asked of a set, not of the
        # selector's map: its miss raises a KeyError whose message is the socket's repr,
        # two system calls, getsockname and getpeername, on every frame sent.)
        if buffer:
            if task not in self.writing:
                self.writing.add(task)
                self.selector.register(sock, selectors.EVENT_WRITE, ("out", task))
        elif task in self.writing:
            self.writing.discard(task)
            self.selector.unregister(sock)

    def _connect(self, task: int) -> None:
        """Start a connection to ``task``: it writes once ``task`` welcomes it.

        The peers connect to each other at once, so nobody waits here for a
        welcome.  An address file may be stale (a failed attempt of the stage
        wrote it, its port is closed or now another task's): the connection is
        then refused or closed unwelcomed, and a later flush reads the file again.
        """
        path = self.folder / f"t{task}.addr"
        first = self.connecting.setdefault(task, time.monotonic())
        if time.monotonic() - first > EXCHANGE_TIMEOUT_S:
            raise ExchangeError(f"task {task} did not publish its address in {path.parent}")
        sock: socket.socket | None = None
        try:
            address = json.loads(path.read_text())
            sock = _local_connection(address.get("local"))
            if sock is None:
                sock = socket.create_connection((address["host"], address["port"]), timeout=10)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(_HELLO.pack(self.secret, self.me, task))
        except (OSError, ValueError, KeyError, AttributeError):
            if sock is not None:  # (the hello failed: closed, not left to the collector)
                sock.close()
            return  # (not published yet, or stale: tried again at the next flush)
        sock.setblocking(False)
        self.outgoing[task] = sock
        self.selector.register(sock, selectors.EVENT_READ, ("hello", task))

    def _welcome(self, task: int) -> None:
        sock = self.outgoing[task]
        self.selector.unregister(sock)
        try:
            answer = sock.recv(1)
        except BlockingIOError:
            self.selector.register(sock, selectors.EVENT_READ, ("hello", task))
            return
        except OSError:
            answer = b""
        if answer != _WELCOME:  # refused: stale address; a later flush connects again
            sock.close()
            del self.outgoing[task]
            return
        self.welcomed.add(task)
        self.connecting.pop(task, None)
        self._write(task)

    def poll(self, timeout: float) -> list[Message]:
        """Messages that arrived (waiting up to ``timeout`` seconds for the first)."""
        if not self.arrived:
            self._select(timeout)
        out, self.arrived = self.arrived, []
        return out

    def _select(self, timeout: float) -> None:
        if self.cancelled is not None and self.cancelled():
            raise ExchangeError(f"task {self.me}: another task of the batch failed")
        out = self.arrived
        for key, mask in self.selector.select(timeout):
            tag = key.data
            if isinstance(tag, socket.socket):  # one of the listening sockets
                self._accept(tag)
            elif isinstance(tag, tuple) and tag[0] == "hello":
                self._welcome(tag[1])
            elif isinstance(tag, tuple):  # an outgoing socket can take more bytes
                self._write(tag[1])
            elif mask & selectors.EVENT_READ:
                self._read(key.fileobj, out)  # type: ignore[arg-type]

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                sock, _ = server.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            self.incoming[sock] = _Inbox()
            self.selector.register(sock, selectors.EVENT_READ, "in")

    def _read(self, sock: socket.socket, out: list[Message]) -> None:
        inbox = self.incoming[sock]
        ended = False
        while True:
            buffer, filled = inbox.buffer, inbox.filled
            room = len(buffer) - filled
            try:
                with memoryview(buffer)[filled:] as tail:
                    got = sock.recv_into(tail)
            except BlockingIOError:
                break
            except OSError:
                got = 0
            if not got:  # the peer finished (or died: its missing answers time out)
                ended = True  # (its last frames may have come in this same read)
                break
            inbox.filled = filled + got
            if got < room:
                # It took all there was: no second call to learn that the socket is
                # empty now (epoll says so at the next poll if more came meanwhile).
                break
            self._unpack(sock, inbox, out)  # (a full buffer: make room, then read on)
            if sock not in self.incoming:
                return
            inbox.make_room()
        self._unpack(sock, inbox, out)
        if ended and sock in self.incoming:
            self.selector.unregister(sock)
            del self.incoming[sock]
            self.verified.discard(sock)
            sock.close()

    def _unpack(self, sock: socket.socket, inbox: _Inbox, out: list[Message]) -> None:
        """Check the hello of ``sock``'s ``inbox``, then move its whole frames to ``out``."""
        buffer, offset, end = inbox.buffer, 0, inbox.filled
        if sock not in self.verified:
            if end < _HELLO.size:
                return
            secret, _peer, target = _HELLO.unpack_from(buffer)
            if secret != self.secret or target != self.me:  # not for this task: read nothing
                self.selector.unregister(sock)
                del self.incoming[sock]
                sock.close()
                return
            offset = _HELLO.size
            self.verified.add(sock)
            with contextlib.suppress(OSError):  # (a peer gone already needs no welcome)
                sock.send(_WELCOME)  # (one byte into an empty send buffer: it goes)
        # Whole frames are unpickled where they lie (no copy of each body); what is left
        # of a frame moves to the front of the buffer once.
        with memoryview(buffer) as view:
            while end - offset >= _HEADER.size:
                (size,) = _HEADER.unpack_from(buffer, offset)
                start = offset + _HEADER.size
                if end < start + size:
                    break
                self.frames_received += 1
                out.extend(pickle.loads(view[start : start + size]))
                offset = start + size
        inbox.consumed(offset)

    def close(self) -> None:
        """Close every socket (after :meth:`flush` with ``wait``)."""
        servers = [self.server] if self.local is None else [self.server, self.local]
        for sock in [*self.outgoing.values(), *self.incoming, *servers]:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()
        self.selector.close()
