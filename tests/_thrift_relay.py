"""A TCP relay in front of a real HBase Thrift server that plays the network's part in
the fault tests (``tests/hbase/test_hbase_thrift2_faults.py``, the multi-server module):
an answer lost after the call applied, a call applied twice as HBase's own client
retries it without a nonce after a region server's answer was lost, an answer that
never comes in time. The server and HBase behind it stay real.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """A TCP relay to *target* (``host:port``). Thrift's client waits for each answer
    before its next request, so the relay passes a request on and then the answer back,
    except for the first request that names :attr:`method` once :attr:`fault` is set
    (every such request while :attr:`repeat` is true):

    * ``"drop"`` sends it, takes HBase's answer and closes the client's connection (the
      call applied; its answer is lost);
    * ``"replay"`` sends it twice and returns the second answer (a retry of an applied
      call);
    * ``"cut"`` sends it and closes both connections at once, without waiting for the
      answer (a client whose socket timed out on a slow call: the server finishes the
      call on its own);
    * ``"count"`` passes it on as any other: :attr:`played` counts the calls made.

    :attr:`calls` names every call passed on, faulty or not, in order (binary protocol:
    the name from the message header; ``b"?"`` otherwise)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.hostport = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.method = b"checkAndMutate"
        self.fault: str | None = None
        self.repeat = False
        self.played = 0
        self.calls: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take_fault(self, request: bytes) -> str | None:
        with self._lock:
            self.calls.append(_method(request))
            if self.fault is None or self.method not in request:
                return None
            fault = self.fault
            if not self.repeat:
                self.fault = None
            self.played += 1
            return fault

    @staticmethod
    def _answer(server: socket.socket) -> bytes:
        """HBase's whole answer: what arrives until the line is quiet (loopback)."""
        server.settimeout(None)
        answer = server.recv(1 << 20)
        server.settimeout(0.05)
        with contextlib.suppress(TimeoutError):
            while more := server.recv(1 << 20):
                answer += more
        return answer

    def _serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.target)
        with contextlib.suppress(OSError):
            while request := client.recv(1 << 20):
                fault = self._take_fault(request)
                server.sendall(request)
                if fault == "cut":
                    break  # the call goes on in the server; nobody waits for its answer
                answer = self._answer(server)
                if fault == "replay":
                    server.sendall(request)
                    answer = self._answer(server)
                elif fault == "drop":
                    break  # the call applied; its answer never arrives
                client.sendall(answer)
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def _method(request: bytes) -> bytes:
    """The called method's name in a binary-protocol request (strict: a version word,
    the name's length, the name), else ``b"?"``."""
    if request[:2] != b"\x80\x01" or len(request) < 8:
        return b"?"
    return request[8:8 + int.from_bytes(request[4:8], "big")]
