"""Make a private CA and the certificates of a TLS cluster (docs/tls.md):

    python scripts/tls_certs.py tls/            # needs 'cryptography' (pip install cryptography)

writes into ``tls/``: ``ca.pem`` (the CA every side trusts); ``oracle.pem``/``.key``
(the oracles' server certificate, for the host names oracle1, oracle2, localhost,
127.0.0.1 and --host); ``zookeeper.pem``/``.key`` and ``zookeeper-keystore.pem`` (key and
certificate in one file, ZooKeeper's PEM key store); ``client.pem``/``.key`` (the client
certificate of oracles, workers and applications). Keys are mode 0600. Valid for --days.

For tests and small deployments: a production cluster takes its certificates from its
own PKI, with the same file layout.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests._tls import TestCA  # noqa: E402

HOSTS = ("oracle1", "oracle2", "zookeeper", "localhost", "127.0.0.1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("directory", help="where to write the files (created if missing)")
    p.add_argument("--host", action="append", default=[], help="another server host name")
    p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    args = p.parse_args(argv)
    hosts = (*HOSTS, *args.host)
    ca = TestCA(args.directory, "percolator cluster CA", days=args.days + 1)
    ca.issue("oracle", hosts=hosts, days=args.days)
    ca.combined(ca.issue("zookeeper", hosts=hosts, days=args.days))
    ca.issue("client", client=True, hosts=("client",), days=args.days)
    for name in sorted(os.listdir(args.directory)):
        print(os.path.join(args.directory, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
