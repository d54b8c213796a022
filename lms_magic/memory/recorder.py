"""A background thread that calls a sampling function at a fixed interval."""

from __future__ import annotations

import threading
from typing import Callable


class BackgroundSampler:
    """Calls ``sample()`` every ``interval_s`` seconds on a daemon thread.

    The thread is named, stops through an ``Event`` and is joined by
    :meth:`stop`, so it never outlives the window it measures. An exception
    inside ``sample`` is kept in :attr:`error` and ends the sampling; it never
    reaches the user's code.

    Args:
        sample: the function called at each tick.
        interval_s: seconds between calls.
        name: the thread's name.

    Example:
        >>> import time
        >>> ticks = []
        >>> sampler = BackgroundSampler(lambda: ticks.append(1), interval_s=0.001).start()
        >>> time.sleep(0.05)
        >>> sampler.stop()
        >>> len(ticks) >= 1
        True
    """

    def __init__(self, sample: Callable[[], None], interval_s: float, name: str = "lms_magic-sampler"):
        self._sample = sample
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "BackgroundSampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
        except BaseException as error:  # kept for the report; never raised in the user's thread
            self.error = error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
