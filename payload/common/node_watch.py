"""The main node's watch over the other nodes of an AWS Batch multi-node job.

Batch ends a multi-node job only when its main node exits; a child node that dies (its host lost,
its container killed, its flow failed) ends nothing, and the main node's ranks wait in their
collectives. So each child's entrypoint keeps a TCP connection to the main node's entrypoint and
says it is alive every BEAT_S seconds (or a quarter of SILENCE_S); the main node's watcher ends
the attempt when a child goes:

- its connection closes without a goodbye (its container stopped: a killed process tree, a host
  that reset the connection) -> "lost";
- it says nothing for SILENCE_S seconds (a host gone from the network sends no reset) -> "lost";
- it says goodbye with a status other than 0 (finished) or 143 (stopped on the service's signal,
  its last step saved: the other nodes saved it with it) -> "failed STATUS", acted on only if
  this node's pass has not ended by itself FAILED_GRACE_S seconds later (or half SILENCE_S).

usage: node_watch.py serve PORT NODES SILENCE_S NOTIFY_PID RECORD   (the main node)
       node_watch.py beat HOST PORT NODE                            (each child, in the background)
       node_watch.py bye HOST PORT NODE STATUS                      (each child, as it exits)

`serve` writes one line to RECORD, "NODE lost|failed STATUS WHY", sends SIGUSR2 to NOTIFY_PID (the
entrypoint, which stops its running pass) and exits. Both background commands end by themselves
once the process that started them is gone. Works with or without a volume the nodes share.
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

BEAT_S = 5.0            # a child says it is alive this often
CONNECT_TIMEOUT_S = 3.0
FINE = ("0", "143")     # goodbyes that end nothing: finished, or stopped and saved
FAILED_GRACE_S = 30.0   # how long a child's failure may take to end this node's pass by itself
#                         (at most half the silence limit)


def say(text: str) -> None:
    node = os.environ.get("AWS_BATCH_JOB_NODE_INDEX", "?")
    sys.stderr.write(f"jobgen[batch node {node}]: {text}\n")
    sys.stderr.flush()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Watch:
    """What the main node knows of its children: when each last spoke, and how it ended."""

    def __init__(self, nodes: int, silence_s: float) -> None:
        self.silence_s = silence_s
        self.heard: dict[int, float] = {}
        self.ended: dict[int, str] = {}
        self.children = set(range(1, nodes))
        self.verdict: str | None = None

    def line(self, text: str, now: float) -> str | None:
        """One line from a child; returns the reply to send, if any."""
        words = text.split()
        if len(words) < 2 or not words[1].isdigit() or int(words[1]) not in self.children:
            return None
        node = int(words[1])
        self.heard[node] = now
        if words[0] == "bye" and len(words) >= 3:
            self.ended[node] = words[2]
            if words[2] not in FINE and self.verdict is None:
                self.verdict = f"{node} failed {words[2]} its flow ended with status {words[2]}"
            return "ok\n"
        return None

    def closed(self, node: int | None) -> None:
        """A child's connection closed: fine after its goodbye, otherwise the child is gone."""
        if node is None or node in self.ended or self.verdict is not None:
            return
        self.verdict = (f"{node} lost 0 its connection to the main node closed without a "
                        "goodbye: its container stopped or its host went away")

    def tick(self, now: float) -> None:
        if self.verdict is not None:
            return
        for node, last in sorted(self.heard.items()):
            if node not in self.ended and now - last > self.silence_s:
                self.verdict = (f"{node} lost 0 silent for {now - last:.0f} s (more than "
                                f"{self.silence_s:g} s): its host is unreachable")
                return


def serve(port: int, nodes: int, silence_s: float, notify: int, record: Path) -> int:
    watch = Watch(nodes, silence_s)
    try:
        listener = socket.create_server(("", port), reuse_port=False)
    except OSError as exc:
        say(f"cannot watch the other nodes on port {port} ({exc}); a node that dies is noticed "
            "only by the collective timeout")
        return 0
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    owners: dict[socket.socket, list] = {}     # connection -> [node or None, pending bytes]
    say(f"watching the other {nodes - 1} node(s) on port {port}: a node silent for "
        f"{silence_s:g} s, or gone without a goodbye, ends this attempt")
    while alive(notify):
        now = time.monotonic()
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is listener:
                try:
                    conn, _addr = listener.accept()
                except OSError:
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, None)
                owners[conn] = [None, b""]
                continue
            conn = key.fileobj  # type: ignore[assignment]
            state = owners[conn]
            try:
                data = conn.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(conn)
                conn.close()
                del owners[conn]
                watch.closed(state[0])
                continue
            state[1] += data
            while b"\n" in state[1]:
                raw, state[1] = state[1].split(b"\n", 1)
                text = raw.decode("ascii", "replace")
                words = text.split()
                if len(words) >= 2 and words[1].isdigit() and words[0] in ("hello", "beat"):
                    state[0] = int(words[1])
                reply = watch.line(text, now)
                if reply:
                    try:
                        conn.sendall(reply.encode())
                    except OSError:
                        pass
        watch.tick(time.monotonic())
        if watch.verdict is not None and " failed " in watch.verdict:
            # A child's failure mostly reaches this node's ranks by itself (a failed collective,
            # a failed rendezvous), and its own status and words say more: the watcher acts only
            # where they would hang (HCCL waits for its collective timeout).
            deadline = time.monotonic() + min(FAILED_GRACE_S, silence_s / 2)
            while alive(notify) and time.monotonic() < deadline:
                time.sleep(0.5)
            if not alive(notify):
                return 0
        if watch.verdict is not None:
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_name(f".{record.name}.{os.getpid()}")
            tmp.write_text(watch.verdict + "\n")
            os.replace(tmp, record)
            node, kind, _status, why = watch.verdict.split(" ", 3)
            say(f"node {node} {'is lost' if kind == 'lost' else 'failed'}: {why}; "
                "ending this attempt")
            try:
                os.kill(notify, signal.SIGUSR2)
            except OSError:
                pass
            return 0
    return 0


def beat_interval(env: Mapping[str, str]) -> float:
    """BEAT_S, or a quarter of the job's silence limit where that is shorter."""
    try:
        silence = float(env.get("JOBGEN_NODE_SILENCE", "") or "inf")
    except ValueError:
        silence = float("inf")
    return max(0.2, min(BEAT_S, silence / 4))


def beat(host: str, port: int, node: int) -> int:
    parent = os.getppid()
    interval = beat_interval(os.environ)
    hello = True
    while os.getppid() == parent:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as conn:
                while os.getppid() == parent:
                    conn.sendall(f"{'hello' if hello else 'beat'} {node}\n".encode())
                    hello = False
                    time.sleep(interval)
        except OSError:
            time.sleep(1.0)    # the main node's watcher is not up yet, or went away
    return 0


def bye(host: str, port: int, node: int, status: str) -> int:
    """The child's last word; waits for the watcher to take it (so that the connection of its
    beats, which closes next, is not read as a loss)."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as conn:
            conn.sendall(f"bye {node} {status}\n".encode())
            conn.recv(16)
    except OSError:
        pass     # the main node has gone already: nobody to tell
    return 0


def main(args: list[str]) -> int:
    try:
        if len(args) == 6 and args[0] == "serve":
            return serve(int(args[1]), int(args[2]), float(args[3]), int(args[4]),
                         Path(args[5]))
        if len(args) == 4 and args[0] == "beat":
            return beat(args[1], int(args[2]), int(args[3]))
        if len(args) == 5 and args[0] == "bye":
            return bye(args[1], int(args[2]), int(args[3]), args[4])
    except ValueError as exc:
        say(f"node_watch: {exc}")
        return 2
    say("usage: node_watch.py serve PORT NODES SILENCE_S NOTIFY_PID RECORD | "
        "beat HOST PORT NODE | bye HOST PORT NODE STATUS")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
