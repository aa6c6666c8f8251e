"""The node agent's main loop and its side of the hook channel (``channel``): one ``poll``
over the listening socket and every open connection, so that no caller ever holds another.

The socket is 0666: any local process may connect, send bytes one at a time, or never read.
The agent answers a caller the moment it accepts it (from the caller's kernel credentials:
nothing a caller sends is read) and queues the reply without blocking. From then on the
connection lives at most ``CONNECTION_DEADLINE_S`` IN TOTAL, however the caller trickles
bytes, and takes at most ``MAX_REQUEST_BYTES`` from it (discarded unread: closing a socket
with unread input resets it, and a caller that sent something would lose its reply). At most
``MAX_CONNECTIONS`` are open; a new caller closes the oldest, whose reply was handed over when
it was accepted. So a caller costs the agent one answer and a short-lived slot, and every
other caller is answered in the round its connection is accepted.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

from cosched_node import channel, procs
from cosched_node.errors import EXIT_NO_STATE

#: The most time one connection may be open, from its answer to its close. The PREPARE_JOB
#: hook takes its reply at once (it is in the socket's buffer when the caller is accepted).
CONNECTION_DEADLINE_S = 1.0
#: The most bytes a caller may send (the hook sends none); one more closes the connection.
MAX_REQUEST_BYTES = 1 << 16
#: Connections open at most: a new caller closes the oldest.
MAX_CONNECTIONS = 64
#: The longest one ``select`` waits: how soon the loop sees a stop, a tick or a pending cpuset.
POLL_S = 0.5
RECV_BYTES = 4096
AGENT_ERROR = {"status": "refused", "code": EXIT_NO_STATE, "message": "node agent error"}
Answer = Callable[[int, int], Dict[str, Any]]
Log = Callable[[str], None]


@dataclass
class Connection:
    """One accepted caller: the reply bytes not yet sent, the bytes it sent so far, its deadline."""
    sock: socket.socket
    deadline: float
    unsent: bytes
    received: int = 0
    reading: bool = True    # False once the caller shut down its side


class HookServer:
    """The listening socket and every open hook connection, served in ``poll`` rounds."""

    def __init__(self, listener: socket.socket, answer: Answer, log: Log, deadline_s: float = CONNECTION_DEADLINE_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.listener, self.answer, self.log = listener, answer, log
        self.deadline_s, self.max_connections = deadline_s, max_connections
        self.open: Dict[socket.socket, Connection] = {}

    def poll(self, timeout_s: float) -> bool:
        """One round: wait at most ``timeout_s`` (less when a deadline comes first) for the
        listener or a connection, move bytes, accept one caller, close every connection that
        is done or past its deadline. True when anything was ready."""
        now = time.monotonic()
        if self.open:
            timeout_s = min(timeout_s, max(0.0, min(c.deadline for c in self.open.values()) - now))
        by_fd = {c.sock.fileno(): c for c in self.open.values()}
        poller = select.poll()    # not select(): no limit on descriptor numbers
        for fd, connection in by_fd.items():
            wanted = (select.POLLIN if connection.reading else 0) | (select.POLLOUT if connection.unsent else 0)
            poller.register(fd, wanted)
        poller.register(self.listener, select.POLLIN)
        try:
            events = poller.poll(timeout_s * 1000)
        except InterruptedError:
            return False
        caller_waiting = False
        for fd, mask in events:
            connection = by_fd.get(fd)
            if connection is None:
                caller_waiting = True      # accepted after the others: their input drained first
                continue
            if mask & select.POLLOUT and connection.sock in self.open:
                self._send(connection)
            if mask & (select.POLLIN | select.POLLHUP | select.POLLERR) and connection.sock in self.open:
                if connection.reading:
                    self._discard_input(connection)   # input, or its end (a hang-up reads as end of input)
                else:
                    self._close(connection)           # hung up before it took its whole reply
        if caller_waiting:
            self._accept()
        now = time.monotonic()
        for connection in [c for c in self.open.values() if c.deadline <= now]:
            self._close(connection)
        return bool(events)

    def close_all(self) -> None:
        for connection in list(self.open.values()):
            self._close(connection)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:   # e.g. out of file descriptors: the caller stays queued
            self.log(f"hook connection not accepted: {exc.strerror or exc}")
            return
        sock.setblocking(False)
        if len(self.open) >= self.max_connections:
            self._close(min(self.open.values(), key=lambda c: c.deadline))
        try:
            peer_pid, peer_uid = channel.peer(sock)
            reply = channel.encode_reply(self.answer(peer_pid, peer_uid))
        except Exception as exc:  # one bad caller never stops the agent
            self.log(f"hook request failed: {exc.__class__.__name__}: {exc}")
            reply = channel.encode_reply(AGENT_ERROR)
        connection = Connection(sock, time.monotonic() + self.deadline_s, reply)
        self.open[sock] = connection
        self._send(connection)

    def _send(self, connection: Connection) -> None:
        try:
            sent = connection.sock.send(connection.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        connection.unsent = connection.unsent[sent:]
        if not connection.unsent:
            try:
                connection.sock.shutdown(socket.SHUT_WR)   # the caller reads the reply to its end
            except OSError:
                self._close(connection)
                return
            if not connection.reading:
                self._close(connection)

    def _discard_input(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        connection.received += len(data)
        if connection.received > MAX_REQUEST_BYTES:
            self._close(connection)
        elif not data:
            connection.reading = False
            if not connection.unsent:
                self._close(connection)

    def _close(self, connection: Connection) -> None:
        self.open.pop(connection.sock, None)
        connection.sock.close()


def serve(agent: Any, listener: socket.socket, stopping: List[int], once: bool) -> None:
    """The agent's main loop: a tick every interval; hook callers, and the cpusets of a job
    that just started, in between (``agent`` is an ``agent.Agent``)."""
    hooks = HookServer(listener, agent.answer, agent.log)
    next_tick = next_sync = 0.0
    try:
        while not stopping:
            if time.monotonic() >= next_tick:
                try:
                    agent.tick()
                except Exception as exc:  # survive one bad interval; the heartbeat goes stale
                    agent.log(f"interval failed: {exc.__class__.__name__}: {exc}")
                if once:
                    return
                next_tick = time.monotonic() + agent.interval_s
            hooks.poll(max(0.0, min(POLL_S, next_tick - time.monotonic())))
            if time.monotonic() >= next_sync and agent.pending_cpusets():
                next_sync = time.monotonic() + POLL_S   # a job just started: its cpuset before the next tick
                try:
                    agent.sync_cpusets(procs.process_table(agent.proc_root))
                except Exception as exc:
                    agent.log(f"cpuset sync failed: {exc.__class__.__name__}: {exc}")
    finally:
        hooks.close_all()
