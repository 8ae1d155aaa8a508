"""Peak memory of a block of work: CUDA ``max_memory_allocated``, or on CPU the glibc heap in use,
sampled by a thread every millisecond (torch's CPU tensors live there; tracemalloc does not see them,
and a warm process's RSS barely moves).

>>> import torch
>>> with PeakMemory(torch.device("cpu")) as mem:
...     x = torch.ones(64, 2**20 // 4)      # 64 MiB
>>> 60 < mem.peak_mib < 80
True
"""

from __future__ import annotations

import ctypes
import threading
import time

import torch


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _cpu_bytes_probe():
    """A function returning the bytes the process has in use: glibc's heap in use (``mallinfo2``:
    allocated chunks + mmapped blocks, where torch's CPU tensors live) or, elsewhere, the RSS."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2

        def heap() -> int:
            mi = libc.mallinfo2()
            return mi.uordblks + mi.hblkhd

        heap()
        return heap, "cpu heap in use (glibc mallinfo2, sampled)"
    except (OSError, AttributeError):
        import psutil  # lazy: only where glibc's mallinfo2 is missing

        proc = psutil.Process()
        return (lambda: proc.memory_info().rss), "cpu rss growth (sampled)"


class PeakMemory:
    """Peak memory of a block above what was in use when it started: CUDA ``max_memory_allocated``, or
    on CPU the heap in use sampled by a thread every millisecond (tracemalloc does not see torch's
    CPU allocator, and a warm process's RSS barely moves)."""

    def __init__(self, device):
        self.device = device
        self.peak_mib = 0.0
        self.kind = "cuda max_memory_allocated"

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.probe, self.kind = _cpu_bytes_probe()
        self.base = self.peak = self.probe()
        self.stop = threading.Event()

        self.peak_at = time.perf_counter()  # when the peak was sampled (perf_counter seconds)

        def sample():
            while not self.stop.is_set():
                v = self.probe()
                if v > self.peak:
                    self.peak, self.peak_at = v, time.perf_counter()
                time.sleep(0.001)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, self.probe())
            self.peak_mib = (self.peak - self.base) / 2**20
        return False
