"""bench.procstats: the broker connections of a process tree are its main process's
established connections to the broker's port, and no others."""

from __future__ import annotations

import os
import socket
from contextlib import ExitStack

from bench.procstats import ProcessTree


def test_counts_the_main_process_connections_to_the_port_only() -> None:
    tree = ProcessTree(os.getpid())
    with ExitStack() as stack:
        broker = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        other = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = broker.getsockname()[1]
        assert tree.broker_connections(port) == 0
        for _ in range(2):
            stack.enter_context(socket.create_connection(broker.getsockname()))
            stack.enter_context(broker.accept()[0])
        stack.enter_context(socket.create_connection(other.getsockname()))
        stack.enter_context(other.accept()[0])
        # Two to the broker; the accepted ends and the other server's are not to its port.
        assert tree.broker_connections(port) == 2
