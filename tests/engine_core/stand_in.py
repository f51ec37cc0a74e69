"""A stand-in engine core: a ZeroMQ ROUTER at ``address`` served by a thread of this process,
each message handed to ``answer`` (a subclass's), for tests that need a core's socket and not
its model."""

from __future__ import annotations

import threading

import zmq

from service.engine_core.protocol import ToCore, decode_to_core
from service.engine_core.server import tuned


class StandInCore:
    def __init__(self, address: str) -> None:
        self.address = address
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):  # the subclass's type
        self._thread.start()
        assert self._bound.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def answer(self, router: zmq.Socket, peer: bytes, message: ToCore) -> None:
        raise NotImplementedError

    def between(self, router: zmq.Socket) -> None:
        """Between messages (at least every 10 ms): what the stand-in sends unasked."""

    def _serve(self) -> None:
        context = zmq.Context()
        router = context.socket(zmq.ROUTER)
        tuned(router)
        router.bind(self.address)
        self._bound.set()
        try:
            while not self._stop.is_set():
                self.between(router)
                if router.poll(10):
                    peer, payload = router.recv_multipart()
                    self.answer(router, peer, decode_to_core(payload))
        finally:
            router.close(linger=0)
            context.term()
