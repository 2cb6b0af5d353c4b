#!/bin/sh
# Regenerate the Python stubs of the timestamp oracle from oracle/timestamp_oracle.proto.
#
#   scripts/gen_proto.sh [OUTPUT_ROOT]
#
# OUTPUT_ROOT defaults to the repository root; the stubs land in OUTPUT_ROOT/oracle/_proto/.
# Needs grpcio-tools (pip install grpcio-tools). tests/oracle/test_proto.py checks that the
# committed stubs are what this script produces.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT/oracle/_proto"
cd "$ROOT"
# Map oracle/ to the virtual path oracle/_proto/ so that the generated grpc module imports
# "from oracle._proto import timestamp_oracle_pb2".
"$PYTHON" -m grpc_tools.protoc \
    "-Ioracle/_proto=oracle" \
    "--python_out=$OUT" \
    "--pyi_out=$OUT" \
    "--grpc_python_out=$OUT" \
    oracle/timestamp_oracle.proto
[ -f "$OUT/oracle/_proto/__init__.py" ] || : > "$OUT/oracle/_proto/__init__.py"
