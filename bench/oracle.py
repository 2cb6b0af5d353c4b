"""Benchmark of the timestamp oracle: capacity, batching client vs naive client, failover.

    python bench/oracle.py                 # defaults, about a minute
    python bench/oracle.py --duration 10 --failovers 5
    python bench/oracle.py --tls --failovers 0 --blocks 1   # TLS against plaintext

Starts its own oracle server processes (and a ZooKeeper from Debian's ``zookeeper``
package for the failover part, as the tests do) and kills them all at the end.

1. **Server capacity**: ``--capacity-procs`` processes x ``--capacity-threads`` threads,
   each sending ``GetTimestamps(count=B)`` back to back, for each block size B in
   ``--blocks``. Timestamps served per second, counted by the server. Paper: about
   2 million/s from one machine.
2. **End to end**: ``--procs`` processes x ``--threads`` threads, each calling
   ``get_timestamp()`` one at a time: the batching :class:`oracle.OracleClient` against a
   naive client (one RPC per timestamp, the same stub and channel options as the batching
   client, one channel for all threads of a process), on the same server in the same run.
   Also reported: timestamps per RPC (at most ``--threads``: one RPC in flight per
   process) and the CPU time per timestamp of the client processes and of the server,
   which is what the two clients trade against each other on a machine whose cores they
   share. Target: batching at least 50x naive.
4. **TLS** (``--tls``): the end-to-end measurement again against a mutual-TLS server
   (certificates from a throwaway CA, ``tests/_tls.py``; needs ``cryptography``), in the
   same run, and the ratio TLS / plaintext for both clients.
3. **Failover**: three replicas on ZooKeeper; a client draws timestamps continuously;
   the leader is killed with SIGKILL; time from the kill to the first timestamp served by
   the new leader. Target under 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This file is bench/oracle.py: keep bench/ off the path so that "import oracle" is the package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, ROOT)

from bench._common import cpu_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- worker processes ------------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    """``bench/oracle.py _worker``: draw timestamps from start_at for duration seconds."""
    import grpc

    from oracle import CHANNEL_OPTIONS, OracleClient
    from oracle import timestamp_oracle_pb2 as pb
    from oracle import timestamp_oracle_pb2_grpc as pb_grpc

    counts = [0] * args.threads
    end = args.start_at + args.duration
    cpu_start = [0.0]
    tls = None
    if args.ca:
        from percolator import TlsConfig

        tls = TlsConfig(ca=args.ca, cert=args.cert, key=args.key)
    if args.mode == "batching":
        client = OracleClient(args.target, tls=tls)

        def draw() -> int:
            return int(client.get_timestamp())

        draw()  # connect before the clock starts
    else:
        # The batching client's stub and channel options; one RPC per timestamp.
        address = args.target.partition("://")[2]
        if tls is None:
            channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            ca, cert, key = tls.read()
            creds = grpc.ssl_channel_credentials(ca, key, cert)
            channel = grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        stub = pb_grpc.TimestampOracleStub(channel)
        request = pb.GetTimestampsRequest(count=args.block)

        def draw() -> int:
            return int(stub.GetTimestamps(request, timeout=30).first)

        draw()

    def run(i: int) -> None:
        time.sleep(max(0.0, args.start_at - time.time()))
        if i == 0:
            cpu_start[0] = time.process_time()
        n = 0
        last = 0
        while time.time() < end:
            ts = draw()
            assert ts > last
            last = ts
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"calls": sum(counts), "cpu": time.process_time() - cpu_start[0]}))
    return 0


def run_workers(
    mode: str,
    target: str,
    procs: int,
    threads: int,
    duration: float,
    block: int = 1,
    server: Server | None = None,
    tls_args: list[str] | None = None,
) -> tuple[int, float, float]:
    """Calls made, CPU seconds of the worker processes and of *server* during the run."""
    start_at = time.time() + 3.0  # leave time for the workers to import and connect
    cmd = [sys.executable, os.path.abspath(__file__), "_worker", mode, target]
    cmd += ["--threads", str(threads), "--duration", str(duration)]
    cmd += ["--block", str(block), "--start-at", repr(start_at), *(tls_args or [])]
    ps = [subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=ROOT) for _ in range(procs)]
    server_cpu = 0.0
    if server is not None:
        time.sleep(max(0.0, start_at - time.time()))
        before = server.cpu_seconds()
        time.sleep(duration)
        server_cpu = server.cpu_seconds() - before
    total = 0
    cpu = 0.0
    for p in ps:
        out, _ = p.communicate(timeout=duration + 120)
        if p.returncode != 0:
            raise RuntimeError(f"{mode} worker failed with status {p.returncode}")
        result = json.loads(out)
        total += result["calls"]
        cpu += result["cpu"]
    return total, cpu, server_cpu


# -- servers ---------------------------------------------------------------------------


class Server:
    def __init__(self, args: list[str], log_dir: str, tls: Any = None) -> None:
        self.tls = tls  # the TlsConfig its clients use, or None
        self.scheme = "grpc" if tls is None else "grpcs"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(os.path.join(log_dir, f"oracle-{self.port}.log"), "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oracle",
                "--listen",
                self.address,
                "--log-level",
                "WARNING",
                *args,
            ],
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def cpu_seconds(self) -> float:
        """User and system CPU time of the server process so far (0 where /proc is missing)."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status(self) -> Any:
        from oracle import OracleClient

        with OracleClient(f"{self.scheme}://{self.address}", deadline=1.0, tls=self.tls) as c:
            return c.status()

    def wait(self, leader: bool = True, timeout: float = 30.0) -> None:
        from percolator import OracleUnavailable

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if self.status().leader == leader:
                    return
            except OracleUnavailable:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"oracle {self.address} not ready")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.log.close()


# -- the three measurements ------------------------------------------------------------


def bench_capacity(args: argparse.Namespace, server: Server) -> list[dict[str, float]]:
    rows = []
    for block in args.blocks:
        before = server.status().served
        calls, _, _ = run_workers(
            "naive",
            f"grpc://{server.address}",
            args.capacity_procs,
            args.capacity_threads,
            args.duration,
            block,
        )
        served = server.status().served - before
        rate = calls * block / args.duration
        rows.append({"block": block, "rpcs_per_s": calls / args.duration, "ts_per_s": rate})
        print(
            f"capacity  block={block:>7,}  {calls / args.duration:>9,.0f} RPC/s  "
            f"{rate:>14,.0f} timestamps/s  (server counted {served:,} incl. warm-up)",
            flush=True,
        )
    return rows


def bench_end_to_end(args: argparse.Namespace, server: Server) -> dict[str, float]:
    target = f"{server.scheme}://{server.address}"
    tls_args = []
    if server.tls is not None:
        t = server.tls
        tls_args = ["--ca", t.ca, "--cert", t.cert, "--key", t.key]
    label = "TLS " if server.tls is not None else ""
    result: dict[str, float] = {}
    for mode in ("naive", "batching"):
        st0 = server.status()
        calls, client_cpu, server_cpu = run_workers(
            mode, target, args.procs, args.threads, args.duration, server=server,
            tls_args=tls_args,
        )
        st1 = server.status()
        rpcs = st1.requests - st0.requests
        allocs = st1.allocations - st0.allocations
        rate = calls / args.duration
        calls = max(1, calls)
        result[f"{mode}_per_s"] = rate
        result[f"{mode}_rpcs_per_s"] = rpcs / args.duration
        result[f"{mode}_ts_per_rpc"] = calls / max(1, rpcs)
        result[f"{mode}_rpcs_per_alloc"] = rpcs / max(1, allocs)
        result[f"{mode}_client_cpu_us_per_ts"] = client_cpu / calls * 1e6
        result[f"{mode}_server_cpu_us_per_ts"] = server_cpu / calls * 1e6
        print(
            f"{label}end-to-end {mode:<8} {args.procs}x{args.threads}: "
            f"{rate:>10,.0f} timestamps/s  "
            f"{rpcs / args.duration:>6,.0f} RPC/s  "
            f"({calls / max(1, rpcs):.1f} timestamps per RPC of at most {args.threads}, "
            f"{rpcs / max(1, allocs):.2f} RPCs per allocation)  CPU per timestamp: clients "
            f"{client_cpu / calls * 1e6:,.0f} us, server {server_cpu / calls * 1e6:,.0f} us",
            flush=True,
        )
    result["ratio"] = result["batching_per_s"] / result["naive_per_s"]
    naive_cpu = result["naive_client_cpu_us_per_ts"] + result["naive_server_cpu_us_per_ts"]
    batching_cpu = result["batching_client_cpu_us_per_ts"] + result["batching_server_cpu_us_per_ts"]
    result["cpu_ratio"] = naive_cpu / max(1e-9, batching_cpu)
    print(
        f"{label}end-to-end batching / naive = {result['ratio']:.1f}x (target >= 50x); "
        f"CPU per timestamp, naive / batching = {result['cpu_ratio']:.1f}x",
        flush=True,
    )
    return result


def bench_tls(args: argparse.Namespace, tmp: str, plain: dict[str, float]) -> dict[str, float]:
    from percolator import TlsConfig
    from tests._tls import TestCA

    ca = TestCA(os.path.join(tmp, "tls"))
    server_cert, client_cert = ca.issue("oracle"), ca.issue("client", client=True)
    server = Server(
        ["--state-file", os.path.join(tmp, "tls-ceiling"), "--tls-cert", server_cert.cert,
         "--tls-key", server_cert.key, "--tls-client-ca", ca.ca],
        tmp,
        tls=TlsConfig(ca=ca.ca, cert=client_cert.cert, key=client_cert.key),
    )
    try:
        server.wait()
        tls = bench_end_to_end(args, server)
    finally:
        server.kill()
    for mode in ("naive", "batching"):
        tls[f"{mode}_tls_over_plain"] = tls[f"{mode}_per_s"] / plain[f"{mode}_per_s"]
        print(
            f"TLS / plaintext, {mode}: {tls[f'{mode}_tls_over_plain']:.2f}x throughput; "
            f"CPU per timestamp: clients {plain[f'{mode}_client_cpu_us_per_ts']:,.0f} -> "
            f"{tls[f'{mode}_client_cpu_us_per_ts']:,.0f} us, server "
            f"{plain[f'{mode}_server_cpu_us_per_ts']:,.0f} -> "
            f"{tls[f'{mode}_server_cpu_us_per_ts']:,.0f} us",
            flush=True,
        )
    return tls


def bench_failover(args: argparse.Namespace, tmp: str) -> list[float]:
    from oracle import OracleClient, zk_paths
    from percolator.ext import make_client, start_client
    from tests._zookeeper import ZooKeeperServer, java_available

    missing = java_available()
    if missing:
        print(f"failover: skipped ({missing})")
        return []
    times: list[float] = []
    with ZooKeeperServer() as zk_server:
        chroot = zk_server.create_chroot("bench-oracle")
        _, _, ceiling_path = zk_paths("/bench-oracle")
        zk = make_client(zk_server.hosts, session_timeout=10.0)
        start_client(zk, zk_server.hosts, 30.0, None)
        servers: list[Server] = []

        def spawn() -> Server:
            s = Server(["--zookeeper", chroot, "--session-timeout", str(args.session_timeout)], tmp)
            servers.append(s)
            return s

        try:
            for _ in range(3):
                spawn()
            client = OracleClient(f"zk://{chroot}", deadline=30)
            stamps: list[tuple[float, int]] = []
            stop = threading.Event()

            def draw() -> None:
                while not stop.is_set():
                    ts = client.get_timestamp()
                    stamps.append((time.monotonic(), ts))
                    time.sleep(0.001)

            client.get_timestamp()
            drawer = threading.Thread(target=draw, daemon=True)
            drawer.start()
            for i in range(args.failovers):
                time.sleep(1.0)
                leader = next(s for s in servers if s.process.poll() is None and _leads(s))
                killed_at = time.monotonic()
                leader.kill()
                servers.remove(leader)
                spawn()  # keep three replicas
                old_ceiling = int(zk.get(ceiling_path)[0])
                while True:
                    after = [t for t, ts in stamps[-1000:] if t > killed_at and ts > old_ceiling]
                    if after:
                        break
                    time.sleep(0.01)
                times.append(after[0] - killed_at)
                print(f"failover {i + 1}: {times[-1]:.2f} s", flush=True)
            stop.set()
            drawer.join(timeout=30)
            client.close()
        finally:
            for s in servers:
                s.kill()
            zk.stop()
            zk.close()
    print(
        f"failover: mean {statistics.mean(times):.2f} s, max {max(times):.2f} s "
        f"(session timeout {args.session_timeout:g} s; target < 3 s)",
        flush=True,
    )
    return times


def _leads(s: Server) -> bool:
    try:
        return bool(s.status().leader)
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        p = argparse.ArgumentParser()
        p.add_argument("mode", choices=["batching", "naive"])
        p.add_argument("target")
        p.add_argument("--threads", type=int, required=True)
        p.add_argument("--duration", type=float, required=True)
        p.add_argument("--block", type=int, default=1)
        p.add_argument("--start-at", type=float, required=True)
        p.add_argument("--ca")
        p.add_argument("--cert")
        p.add_argument("--key")
        return worker(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    p.add_argument("--procs", type=int, default=4, help="end-to-end client processes")
    p.add_argument("--threads", type=int, default=16, help="end-to-end threads per process")
    p.add_argument("--capacity-procs", type=int, default=2)
    p.add_argument("--capacity-threads", type=int, default=4)
    p.add_argument(
        "--blocks", type=int, nargs="+", default=[1, 1000, 10_000], help="capacity block sizes"
    )
    p.add_argument("--failovers", type=int, default=3, help="leader kills (0 to skip)")
    p.add_argument("--session-timeout", type=float, default=2.0)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--tls", action="store_true", help="also run end to end against a mutual-TLS server"
    )
    args = p.parse_args(argv)

    print(
        f"machine: {os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}",
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix="bench-oracle-")
    results: dict[str, Any] = {}
    server = Server(["--state-file", os.path.join(tmp, "ceiling")], tmp)
    try:
        server.wait()
        results["capacity"] = bench_capacity(args, server)
        results["end_to_end"] = bench_end_to_end(args, server)
    finally:
        server.kill()
    if args.tls:
        results["tls"] = bench_tls(args, tmp, results["end_to_end"])
    if args.failovers:
        results["failover_s"] = bench_failover(args, tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
