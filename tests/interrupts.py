"""Ctrl-C in the test process, as a notebook kernel delivers it: a real SIGINT."""

import contextlib
import os
import signal
import threading

_pending: list[threading.Timer] = []  # timers started inside kernel_interrupts(), cancelled at its end


@contextlib.contextmanager
def kernel_interrupts():
    """SIGINT raises KeyboardInterrupt in the main thread, as in a kernel, whatever handler a
    library used by an earlier test left installed; at the end every interrupt timer started
    inside is cancelled (none lands in a later test) and the previous handler is restored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        while _pending:
            _pending.pop().cancel()
        signal.signal(signal.SIGINT, previous)


def interrupt_after(seconds: float, elsewhere: bool = False) -> threading.Timer:
    """SIGINT to this process after ``seconds`` (a kernel's interrupt; it also wakes a main
    thread blocked in a system call), or with ``elsewhere`` to the timer's own thread, as the
    kernel may deliver it (Python still raises it in the main thread, but only once that thread
    runs); the started timer, cancelled at the end of the enclosing ``kernel_interrupts()`` if
    it has not fired."""

    def interrupt():
        if elsewhere:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, interrupt)
    _pending.append(timer)
    timer.start()
    return timer
