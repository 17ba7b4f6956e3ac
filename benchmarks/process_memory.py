"""This process's resident memory (Linux /proc), for the benchmarks that report memory."""
import os
import threading


def rss_mib() -> float:
    """Resident set now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    """Peak resident set (VmHWM) since the last reset_peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    """Reset VmHWM to the current resident set (Linux: "5" to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_parts_mib() -> dict:
    """Resident memory by kind: RssAnon (tensors, allocator) and RssFile (mapped files: a
    full-precision safetensors file stays mapped after loading; its clean pages are given back
    under memory pressure, so they are not memory a run needs)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return out


class AnonPeak:
    """The peak anonymous resident set while the block runs, sampled every 5 ms."""

    def __enter__(self):
        self.peak, self.stop = 0.0, threading.Event()

        def sample():
            while not self.stop.is_set():
                self.peak = max(self.peak, rss_parts_mib()["RssAnon"])
                self.stop.wait(0.005)
        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
