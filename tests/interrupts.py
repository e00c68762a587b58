"""Ctrl-C in the test process, as a notebook kernel delivers it: a real SIGINT."""
import contextlib
import os
import signal
import threading


@contextlib.contextmanager
def kernel_interrupts():
    """SIGINT raises KeyboardInterrupt in the main thread, as in a kernel, whatever handler a
    library used by an earlier test left installed; the previous handler is restored after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupt_after(seconds: float) -> threading.Timer:
    """SIGINT to this process after ``seconds`` (a kernel's interrupt; it also wakes a main
    thread blocked in a system call); the started timer, to cancel if no longer wanted."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer
