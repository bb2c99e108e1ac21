#!/usr/bin/env python3
"""The Kafka stand-in's answer to the compose file's health check: like Kafka's own
kafka-broker-api-versions.sh, an API-versions round trip with the broker given by
``--bootstrap-server HOST:PORT``; exits 0 when it answers without an error code."""

import socket
import struct
import sys

API_VERSIONS = 18
CORRELATION_ID = 0x5EED


def main(argv: list[str]) -> int:
    if "--bootstrap-server" not in argv[:-1]:
        print("usage: kafka-broker-api-versions.sh --bootstrap-server HOST:PORT", file=sys.stderr)
        return 2
    host, _, port = argv[argv.index("--bootstrap-server") + 1].rpartition(":")
    client = b"healthcheck"
    request = struct.pack(">hhih", API_VERSIONS, 0, CORRELATION_ID, len(client)) + client
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            answer = b""
            while len(answer) < 10:  # size, correlation id, error code
                chunk = sock.recv(64)
                if not chunk:
                    break
                answer += chunk
    except OSError as error:
        print(f"{host}:{port}: {error}", file=sys.stderr)
        return 1
    if len(answer) < 10:
        print(f"{host}:{port}: short answer", file=sys.stderr)
        return 1
    _size, correlation, code = struct.unpack_from(">iih", answer)
    if correlation != CORRELATION_ID or code != 0:
        print(f"{host}:{port}: correlation {correlation}, error code {code}", file=sys.stderr)
        return 1
    print(f"{host}:{port} answers ApiVersions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
