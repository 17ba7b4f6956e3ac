"""A command killed part way, as a batch scheduler ends a job at its time limit: the helper of
the resume benchmarks (verify_resume.py, scoring_resume.py, command_resume.py)."""
import os
import signal
import subprocess
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run_command(cmd: list[str], log_path: str, watch=None, stop_after: float = None):
    """Run `cmd` from the repository root with its output in `log_path` (a file: a full pipe
    would stall it). With `stop_after`, send SIGTERM that many seconds after the file `watch`
    first appears, or after the callable `watch` first returns true (a job started in the
    background ignores Ctrl-C's SIGINT). Returns (seconds, return code, the log's text)."""
    ready = watch if callable(watch) else (lambda: os.path.exists(watch))
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if stop_after is not None:
        while proc.poll() is None and not ready():
            time.sleep(0.5)
        time.sleep(stop_after)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    proc.wait()
    with open(log_path) as f:
        return time.perf_counter() - start, proc.returncode, f.read()
