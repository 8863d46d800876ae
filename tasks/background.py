"""A loop on a daemon thread of its own, until stopped: the housekeeper's and the batch runner's."""

from __future__ import annotations

import threading
from typing import Self


class Background:
    """Subclasses write `_loop`, which returns once `_stop` is set."""

    name = "background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        raise NotImplementedError
