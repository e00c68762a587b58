"""nbdistributed 0.1.0 driven from Python as a notebook would drive it, for cluster_bench.py --peer.

An IPython shell loads the extension and runs ``%dist_init -n N`` and ``%%distributed`` cells
through its magics; the workers are stopped by PID (the extension's ProcessManager), never by
its ``%dist_shutdown``, which pkills every process whose command line matches a pattern.
"""

import contextlib
import io
import os
import sys
import time

from IPython.core.interactiveshell import InteractiveShell

STEP_CELL = "t = torch.ones(100_000)\ndist.all_reduce(t)\n"
RAISE_CELL = (
    "t = torch.ones(100_000)\n"
    "if rank == 0:\n"
    "    raise RuntimeError('rank 0 fails beside the all-reduce')\n"
    "dist.all_reduce(t)\n"
)


class NbDistributed:
    """``%dist_init -n N`` in an IPython shell; cells timed as ``%%distributed`` runs them."""

    def __init__(self, n):
        # its workers run as ``python`` from PATH: this interpreter's, as in a kernel of this venv
        bindir = os.path.dirname(sys.executable)
        if not os.environ.get("PATH", "").startswith(bindir + os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        self.shell = InteractiveShell.instance()
        with contextlib.redirect_stdout(io.StringIO()):
            self.shell.run_line_magic("load_ext", "nbdistributed")
        self.magic = self.shell.magics_manager.registry["DistributedMagic"]
        self.n = n

    def start(self):
        """Seconds of ``%dist_init -n N`` (workers started, group joined, ready for cells)."""
        out = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out):
            self.shell.run_line_magic("dist_init", f"-n {self.n}")
        elapsed = time.perf_counter() - t0
        if self.magic._comm_manager is None:
            raise RuntimeError(f"nbdistributed did not start: {out.getvalue()}")
        return elapsed

    def answering(self, every_s=0.1):
        """Poll the workers with a no-op (not through the magic) until both answer; seconds of the polling."""
        t0 = time.perf_counter()
        while True:
            try:
                self.magic._comm_manager.send_to_all("execute", "pass", timeout=every_s)
                return time.perf_counter() - t0
            except TimeoutError:
                pass

    def cell(self, code):
        """Seconds of one ``%%distributed`` cell, as its magic runs it (output streamed, namespace synced)."""
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            self.shell.run_cell_magic("distributed", "", code)
        return time.perf_counter() - t0

    def raising_cell(self, code):
        """Run a cell expected to fail; how it ended, from what the magic printed."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.shell.run_cell_magic("distributed", "", code)
        text = out.getvalue()
        if "Timeout waiting for responses" in text:
            return "TimeoutError (no rank's error shown)"
        if "Error on Rank" in text:
            return "rank's error shown"
        return "returned"

    def stop(self):
        """Stop the workers by PID: terminate, then kill what remains (its ProcessManager)."""
        self.magic._disable_distributed_mode()
        comm, processes = self.magic._comm_manager, self.magic._process_manager
        self.magic._comm_manager = self.magic._process_manager = None
        if comm is not None:
            with contextlib.suppress(Exception):
                comm.shutdown()
        if processes is not None:
            with contextlib.redirect_stdout(io.StringIO()):
                processes.shutdown()
