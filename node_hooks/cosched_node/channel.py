"""The hook-to-agent channel: a Unix socket in the agent's root-only state dir.

Any local user may connect (the socket is 0666), but the caller says nothing: the agent
reads the caller's pid from the kernel (``SO_PEERCRED``), requires its parent to be the
starter of a claim the startd reports, and answers with that claim's placement. So a
process can only ever learn the placement of the job it belongs to, and nothing it sends
is read. Replies are one JSON object, at most ``MAX_REPLY_BYTES``; the agent serves callers
with ``hook_server`` (each connection open a short time in total, none holding another).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from typing import Any, Dict, Tuple

from cosched_node.errors import StateError
from cosched_node.state import SOCKET_NAME

MAX_REPLY_BYTES = 1 << 16
#: How long the hook waits for the agent (busy with an interval's work, it answers after it).
HOOK_TIMEOUT_S = 30.0


def listen(state_dir: str) -> socket.socket:
    """The agent's listening socket, DIR/agent.sock (replaces a stale one)."""
    path = os.path.join(state_dir, SOCKET_NAME)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StateError(0, f"{path} exists and is not a socket")
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(64)
    server.setblocking(False)
    return server


def peer(conn: socket.socket) -> Tuple[int, int]:
    """(pid, uid) of the connected process, as the kernel recorded them at connect()."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", raw)
    return pid, uid


def encode_reply(reply: Dict[str, Any]) -> bytes:
    """The reply as the caller reads it: one JSON object, cut to ``MAX_REPLY_BYTES``."""
    return json.dumps(reply, sort_keys=True).encode("utf-8")[:MAX_REPLY_BYTES]


def ask(state_dir: str, timeout_s: float = HOOK_TIMEOUT_S) -> Dict[str, Any]:
    """The hook's side: connect, read the agent's answer for this job. StateError when the
    agent is not there or does not answer in time."""
    path = os.path.join(state_dir, SOCKET_NAME)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(timeout_s)
    try:
        client.connect(path)
        chunks, size = [], 0
        while size <= MAX_REPLY_BYTES:
            chunk = client.recv(8192)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise StateError(exc.errno or 0, f"node agent at {path}: {exc.strerror or exc} "
                                         "(is the node agent running?)") from None
    finally:
        client.close()
    try:
        reply = json.loads(b"".join(chunks).decode("utf-8"))
    except (ValueError, RecursionError):
        raise StateError(0, "the node agent's reply is not JSON") from None
    if not isinstance(reply, dict) or reply.get("status") not in ("ok", "refused"):
        raise StateError(0, "the node agent's reply has no status")
    return reply
