"""The options every engine-core ZeroMQ socket is given, apart from the engine-core server
(service/engine_core/server.py) so that what only opens sockets to engine cores, such as the
supervisor's control connections, does not import the engine with it."""

from __future__ import annotations

import zmq


def tuned(socket: zmq.Socket) -> None:
    """No high-water mark (a dropped message would be a row answered never) and no linger."""
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)
