"""verify's progress line on stderr: subset x prompt counts with rate and time left."""
import sys
import time


class Progress:
    """progress(done, total) printer: at most every `every` seconds, with rate and ETA. A count
    that goes back or a new total starts a new pass (verify's greedy reduction makes many),
    whose rate counts from the previous pass's last call."""

    def __init__(self, label, every=10.0, stream=None, clock=time.perf_counter):
        self.label, self.every, self.stream, self.clock = label, every, stream or sys.stderr, clock
        self.start = self.shown = self.last = clock()
        self.done, self.total = 0, None

    def __call__(self, done, total):
        now = self.clock()
        if done < self.done or total != self.total:
            self.start = self.last
        self.done, self.total, self.last = done, total, now
        if now - self.shown < self.every and done < total:
            return
        self.shown = now
        rate = done / max(now - self.start, 1e-9)
        eta = (total - done) / rate if rate > 0 else float("inf")
        print(f"{self.label}: {done}/{total} subset x prompt ({100 * done / total:.1f} %), "
              f"{rate:,.0f}/s, {eta:,.0f}s left in this pass", file=self.stream, flush=True)
