"""The processes of a private Ray instance end with the process that started it.

``ray.init()`` on a laptop starts a GCS server, a raylet and, under the raylet, a dashboard
agent and a runtime-env agent. The GCS and the raylet die with the process that started
them, but the two agents only notice the raylet is gone, and then spend about a minute
trying to report that to the GCS, which is gone too. After ``kill -9`` of a run, or a second
Ctrl-C that cuts its shutdown short, they linger, holding ports and memory.

The reaper is a small process in its own session (a Ctrl-C at the terminal does not reach
it) that holds the read end of a pipe whose write end only the owner holds. While the owner
lives, the reaper notes the owner's descendants that are Ray's processes every half
second; when the pipe reports end-of-file -- the session ended, or the owner exited however
it exited -- it kills those still running (the same processes: pid and start time both
match) and exits. After an orderly ``ray.shutdown()`` it finds nothing left to do. Other
children of the owner (a notebook's own subprocesses) are never touched.

    python -m fedray.runtime.reaper OWNER_PID RAY_DIR  # from fedray.runtime.session.ray_session
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

POLL_S = 0.5


class Reaper:
    """The owner's end of a reaper: ``stop()`` (or the owner's exit) sets it off."""

    def __init__(self, ray_dir: str):
        read_end, self._write_end = os.pipe()  # non-inheritable: Ray's processes never
        try:  # hold the write end, so its end-of-file means the owner let go or is gone
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fedray.runtime.reaper", str(os.getpid()), ray_dir],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            os.close(read_end)

    def stop(self) -> None:
        """The session is over: the reaper kills what is left of it, and exits."""
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1
            try:
                self.proc.wait(timeout=10)  # quick: it kills and exits on end-of-file
            except subprocess.TimeoutExpired:
                pass


def start(ray_dir: str) -> Reaper | None:
    """A reaper for the Ray processes this process starts (``ray_dir``: where the ray package
    is installed); None off Linux (it reads the process table through psutil, and the
    agents' behaviour it guards against is Linux's)."""
    if not sys.platform.startswith("linux"):
        return None
    return Reaper(ray_dir)


def _ray_process(proc, ray_dir: str) -> bool:
    """One of Ray's processes: workers and agents rename themselves ``ray::...``; the GCS,
    the raylet and Ray's Python services run programs from the ray package."""
    if proc.name().startswith("ray::"):
        return True
    return any(arg.startswith(ray_dir) for arg in proc.cmdline()[:3])


def _descendants(owner, ray_dir: str, known: dict[int, float]) -> None:
    import psutil

    for child in owner.children(recursive=True):
        if child.pid in known:
            continue
        try:
            if _ray_process(child, ray_dir):
                known[child.pid] = child.create_time()
        except psutil.Error:
            continue


def main(argv: list[str] | None = None) -> int:
    import psutil

    argv = sys.argv[1:] if argv is None else argv
    try:
        owner, ray_dir = psutil.Process(int(argv[0])), argv[1]
    except (IndexError, ValueError, psutil.NoSuchProcess):
        return 2
    known: dict[int, float] = {}
    while True:
        try:
            _descendants(owner, ray_dir, known)
        except psutil.NoSuchProcess:
            break
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready and not os.read(0, 4096):
            break  # end of file: the owner is gone
    for pid, started in known.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) < 1e-3:
                proc.kill()
        except psutil.Error:
            continue
    return 0


if __name__ == "__main__":
    sys.exit(main())
