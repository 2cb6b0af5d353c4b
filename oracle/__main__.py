"""``python -m oracle`` / ``percolator-oracle``: run a timestamp oracle server."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

try:
    from oracle._server import DEFAULT_BLOCK_SIZE, DEFAULT_SESSION_TIMEOUT, OracleServer
except ImportError as _e:  # without the extra: main() says what to install
    _MISSING: ImportError | None = _e
else:
    _MISSING = None
from oracle import _INSTALL_HINT
from percolator import InvalidArgument, PercolatorError, TlsConfig, TlsError
from percolator.ext import add_zookeeper_tls_arguments, zookeeper_tls_from_arguments
from percolator.metrics import add_arguments as add_metrics_arguments

log = logging.getLogger("oracle")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="percolator-oracle",
        description=(
            "Timestamp oracle of percolator: hands out strictly increasing timestamps over "
            "gRPC. Timestamps are served from memory below a ceiling that is recorded "
            "durably before use, so a restart (even kill -9) never reissues one. Run one "
            "oracle with --state-file, or several against ZooKeeper with --zookeeper (one "
            "is elected leader; the others take over when it dies)."
        ),
    )
    p.add_argument(
        "--listen",
        required=True,
        metavar="HOST:PORT",
        help="address to serve gRPC on, e.g. 127.0.0.1:7070 (port 0 picks a free port)",
    )
    state = p.add_mutually_exclusive_group(required=True)
    state.add_argument(
        "--state-file",
        metavar="PATH",
        help="single oracle: keep the persisted ceiling in this local file (fsynced); "
        "its directory must exist; one server per file",
    )
    state.add_argument(
        "--zookeeper",
        metavar="HOST:PORT[,...]/CHROOT",
        help="replicated oracle: elect a leader, publish its address and keep the ceiling "
        "in ZooKeeper under CHROOT; clients use zk://HOST:PORT/CHROOT",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="address published in ZooKeeper for clients (default: the --listen address "
        "with the bound port; set it when listening on 0.0.0.0)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        metavar="N",
        help="timestamps reserved by each durable write of the ceiling; a restart skips "
        f"at most this many (default {DEFAULT_BLOCK_SIZE:,})",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=DEFAULT_SESSION_TIMEOUT,
        metavar="SECONDS",
        help="ZooKeeper session timeout; a dead leader is replaced after about this long, "
        "and a leader stops serving half of it after its last ZooKeeper round trip; "
        "ZooKeeper must allow it (minSessionTimeout, default 2 x tickTime) "
        f"(default {DEFAULT_SESSION_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-workers",
        type=int,
        default=32,
        metavar="N",
        help="gRPC handler threads (default 32)",
    )
    tls = p.add_argument_group(
        "TLS", "without --tls-cert/--tls-key the server is plaintext (and logs a warning)"
    )
    tls.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain of this server")
    tls.add_argument(
        "--tls-key",
        metavar="FILE",
        help="PEM private key of --tls-cert (mode 0600 or 0640; refused if others may read it)",
    )
    tls.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require client certificates signed by this CA bundle (mutual TLS)",
    )
    add_zookeeper_tls_arguments(p)
    add_metrics_arguments(p)
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default INFO)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the oracle server until SIGTERM or SIGINT; returns the exit status."""
    if _MISSING is not None:
        print(f"percolator-oracle: {_INSTALL_HINT} ({_MISSING})", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    if args.max_workers < 1:
        log.error("--max-workers must be at least 1, got %d", args.max_workers)
        return 2
    try:
        if args.tls_client_ca and not (args.tls_cert and args.tls_key):
            raise InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key")
        tls = (
            TlsConfig(ca=args.tls_client_ca, cert=args.tls_cert, key=args.tls_key)
            if args.tls_cert or args.tls_key
            else None
        )
        server = OracleServer(
            args.listen,
            state_file=args.state_file,
            zookeeper=args.zookeeper,
            advertise=args.advertise,
            block_size=args.block_size,
            session_timeout=args.session_timeout,
            max_workers=args.max_workers,
            tls=tls,
            zookeeper_tls=zookeeper_tls_from_arguments(args),
        )
        if args.metrics_port is not None:
            from percolator import metrics

            endpoint = metrics.serve(args.metrics_port, args.metrics_host)
            metrics.add_gauge_callback(server.metrics)
            log.info("metrics on http://%s:%d/metrics", args.metrics_host,
                     endpoint.server_port)
        server.start()
    except (InvalidArgument, TlsError, PercolatorError) as e:
        log.error("%s", e)
        return 2
    except Exception as e:  # e.g. ZooKeeper unreachable
        log.error("cannot start the oracle: %s", e)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
