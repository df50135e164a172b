"""Where fedray reads and writes: URLs, and the checks made before anything is written.

Every path a user gives (``output.dir``, ``data.partition``, a recipe's ``out``, a report's
``--out``, a sweep's ``output``) is an fsspec URL. This module is the one place that turns
one into a filesystem, so every command answers the same way -- one line naming the key --
when the URL's protocol is unknown or needs a package, when the filesystem cannot outlive
the process (``memory://`` lives in one process, and a run writes from its driver actor, a
different one), or when the target cannot be written (a real test write, before Ray starts
or any data is read).

It also holds the claim on a directory (``RunClaim``): the exclusive creation of a lock
file, so that two commands given the same target cannot both write into it. ``fedray run``
claims its ``output.dir``, ``fedray sweep`` its ``output``, ``fedray partition`` its ``out``:
one lock, one message naming who holds it.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import socket
import time
import uuid
from typing import Any

import fsspec

from fedray.errors import FedrayError, key_error, one_line

LOCK_FILE = ".fedray.lock"
# what a run writes in its directory (fedray.state.run_dir, .checkpoint, the TensorBoard and
# W&B callbacks; tests/state/test_storage.py holds this list to their names): all that a
# new run that failed is allowed to remove
RUN_WRITES = ("config.yaml", "metrics.jsonl", "summary.json", "model.safetensors",
              "server_state.safetensors", "checkpoint.safetensors",
              "events.out.tfevents.fedray", "client_state", "client_eval", "wandb")


def absolute_url(url: str) -> str:
    """Make a local relative path absolute, so that every process means the same place."""
    if "://" in url:
        return url
    return os.path.abspath(os.path.expanduser(url))


def _protocols(fs: Any) -> tuple[str, ...]:
    """The protocols of ``fs`` and of the filesystems it wraps (a cache over memory://)."""
    out = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    inner = getattr(fs, "fs", None)
    return out + (_protocols(inner) if inner is not None and inner is not fs else ())


def is_local(fs: Any) -> bool:
    return "file" in _protocols(fs)


def _error(key: str, what: str | None, text: str) -> FedrayError:
    """A problem with the URL given as ``key``: a config, recipe or sweep key (``what``), or
    a command-line argument such as ``--out`` (what=None)."""
    return key_error(key, text, what=what) if what else FedrayError(f"{key} {text}")


def filesystem(url: str, key: str, *, durable: bool = False, what: str | None = "config"
               ) -> tuple[Any, str]:
    """``(fs, path)`` for ``url``; a URL fsspec cannot open fails as one line naming ``key``.

    durable: the files must outlive this process or be read by another one (a run's
    directory, a store, a report the CLI writes): an in-memory filesystem is refused."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ValueError as exc:  # "Protocol not known: x"
        proto = url.split("://", 1)[0]
        raise _error(key, what, f"{url}: fsspec knows no protocol '{proto}'" if "not known" in
                     str(exc) else f"cannot open {url}: {one_line(exc)}") from None
    except (ImportError, OSError) as exc:  # s3:// without s3fs; hdfs:// without a JVM
        raise _error(key, what, f"cannot open {url}: {one_line(exc)}") from None
    if durable and "memory" in _protocols(fs):
        raise _error(key, what, f"{url} is in this process's memory, which is gone when it "
                     "ends (and a run writes from its driver actor, another process); give a "
                     "path or a URL of shared storage")
    return fs, path


# what a full disk, a read-only mount or a lost mount look like to a process writing files
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                  errno.EFBIG, errno.EIO)


def storage_failure(exc: BaseException) -> OSError | None:
    """The storage error behind ``exc``, if any: ``exc`` itself, or what it wraps (a Ray
    task's error carries the remote one as ``cause``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return exc
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None


def _first_existing(fs: Any, path: str) -> str:
    parent = path.rstrip("/") or "/"
    while not fs.exists(parent):
        up = posixpath.dirname(parent)
        if up == parent:
            break
        parent = up
    return parent


def check_writable(fs: Any, path: str, url: str, key: str, *, what: str | None = "config"
                   ) -> None:
    """Refuse a target that cannot be written, by writing: a file is created and removed
    in the deepest existing directory on the way to ``path`` (permission bits alone say
    nothing on a read-only mount, or to root). Nothing is left behind."""
    if not is_local(fs):
        probe = f"{path.rstrip('/')}/.fedray-probe-{uuid.uuid4().hex}"
    else:
        where = _first_existing(fs, path)
        if not fs.isdir(where):
            raise _error(key, what, f"{url} cannot be created: {where} is a file")
        probe = f"{where.rstrip('/')}/.fedray-probe-{uuid.uuid4().hex}"
    try:
        with fs.open(probe, "wb") as f:
            f.write(b"fedray")
        fs.rm(probe)
    except OSError as exc:
        raise _error(key, what, f"{url} is not writable: {exc.strerror or one_line(exc)}"
                     ) from None


class RunClaim:
    """A command's exclusive hold on its directory: ``LOCK_FILE``, created with
    exclusive-create semantics (``O_EXCL`` on local and POSIX filesystems; fsspec's mode "xb"
    elsewhere, which is atomic where the backend supports conditional writes, such as s3fs
    and gcsfs, and a check-then-write otherwise: two commands started within the same moment
    on such a store are not told apart). It names the command, host and process that hold
    it, so the next one says who holds it, and a lock left by a killed run on this host is
    recognised as stale and taken over by ``--resume``.

    key, what: the key the directory was given as, in messages (``config key 'output.dir'``,
    ``recipe key 'out'``, ``sweep key 'output'``); command: what the lock says holds it;
    durable: refuse an in-memory filesystem (the Python store writer may write there);
    occupied: the error for a new claim on a directory that already holds something (or is
    a file), when the command has its own words for it."""

    def __init__(self, url: str, key: str = "output.dir", *, what: str = "config",
                 command: str = "fedray run", durable: bool = True,
                 occupied: FedrayError | None = None):
        self.url = url
        self.key = key
        self.what = what
        self.command = command
        self.occupied = occupied
        self.fs, self.path = filesystem(url, key, durable=durable, what=what)
        self.lock = f"{self.path.rstrip('/')}/{LOCK_FILE}"
        self.created: str | None = None  # the topmost directory this claim created
        self.held = False
        self.token = uuid.uuid4().hex

    def _owner(self) -> dict:
        try:
            return json.loads(self.fs.cat_file(self.lock))
        except (OSError, ValueError):
            return {}

    def _describe(self, owner: dict) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("started", 0)))
        # what holds it: "run" (fedray run's locks, and those written before locks named
        # their command), "partition", "sweep"
        noun = str(owner.get("command", "fedray run")).removeprefix("fedray ")
        return (f"{self.url} is in use by another {noun} (pid {owner.get('pid', '?')} on "
                f"{owner.get('host', '?')}, since {when}); if that {noun} is gone, delete "
                f"{self.url.rstrip('/')}/{LOCK_FILE}")

    def _error(self, text: str) -> FedrayError:
        return key_error(self.key, text, what=self.what)

    def _stale(self, owner: dict) -> bool:
        """A lock of this host whose process is gone (or is another process by now)."""
        if owner.get("host") != socket.gethostname() or "pid" not in owner:
            return False
        import psutil

        try:
            proc = psutil.Process(int(owner["pid"]))
            return abs(proc.create_time() - float(owner.get("pid_started", 0))) > 1.0
        except psutil.NoSuchProcess:
            return True

    def _create_lock(self) -> None:
        import psutil

        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "pid_started": psutil.Process().create_time(), "started": time.time(),
                  "token": self.token, "command": self.command}
        with self.fs.open(self.lock, "xb") as f:
            f.write(json.dumps(record).encode())
        self.held = True

    def acquire(self, new: bool) -> None:
        """Claim the directory: a new command's must be empty or absent (it is created), a
        resumed run's must not be held by a live run."""
        fs, path = self.fs, self.path
        if fs.exists(path):
            if not fs.isdir(path):
                raise self.occupied or self._error(f"{self.url} exists and is not a directory")
            entries = fs.ls(path, detail=False)
            if new and entries:
                if any(e.rstrip("/").rsplit("/", 1)[-1] == LOCK_FILE for e in entries):
                    owner = self._owner()
                    if not self._stale(owner):
                        raise self._error(self._describe(owner))
                raise self.occupied or self._error(f"{self.url} already holds files; choose "
                                                   "a new output.dir or remove it")
        else:
            check_writable(fs, path, self.url, self.key, what=self.what)
            top = path.rstrip("/")
            if is_local(fs):  # parents it makes are its own too
                existing = _first_existing(fs, top)
                while posixpath.dirname(top) != existing and posixpath.dirname(top) != top:
                    top = posixpath.dirname(top)
            try:
                fs.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise self._error(f"{self.url} cannot be created: "
                                  f"{exc.strerror or one_line(exc)}") from None
            self.created = top
        for attempt in (1, 2):
            try:
                self._create_lock()
                return
            except FileExistsError:  # another command claimed it first
                owner = self._owner()
                if attempt == 1 and not new and self._stale(owner):
                    fs.rm(self.lock)  # a killed run's lock: ours now
                    continue
                raise self._error(self._describe(owner)) from None
            except OSError as exc:
                if new:  # nothing of ours is there: the directories it made, if still empty
                    self.vacate()
                raise self._error(f"{self.url} is not writable: "
                                  f"{exc.strerror or one_line(exc)}") from None

    def release(self) -> None:
        """Drop the lock, if it is still ours."""
        if self.held and self._owner().get("token") == self.token:
            try:
                self.fs.rm(self.lock)
            except OSError:
                pass  # the run's own error says what went wrong with the storage
        self.held = False

    def vacate(self) -> None:
        """Drop the lock, and the directories this claim created while they are empty:
        a command that failed leaves the place as it found it, and never removes a file it
        did not write (one a user put there meanwhile keeps its directory). Object stores
        have no empty directories: the lock was all there was."""
        self.release()
        if self.created is None or not (is_local(self.fs) or "memory" in _protocols(self.fs)):
            return
        folder = self.path.rstrip("/")
        while True:
            try:
                if not self.fs.exists(folder) or self.fs.ls(folder, detail=False):
                    return
                self.fs.rmdir(folder)  # refuses a directory that is not empty
            except OSError:
                return
            if folder == self.created or posixpath.dirname(folder) == folder:
                return
            folder = posixpath.dirname(folder)

    def discard(self) -> None:
        """Undo a new run that failed before its first round: remove what it wrote, and the
        directories the claim made while they are then empty (``vacate``), so the same
        command can run again. Only the names a run writes (RUN_WRITES, and its temporary
        ``.NAME.*.tmp`` files) are removed: a file someone put into the directory meanwhile
        stays, and so does its directory; and a parent the claim made is never removed
        with what another command has put in it since (a second run's directory beside
        this one's)."""
        try:
            for entry in self.fs.ls(self.path, detail=False):
                name = entry.rstrip("/").rsplit("/", 1)[-1]
                if name in RUN_WRITES or (name.startswith(".") and name.endswith(".tmp")):
                    self.fs.rm(entry, recursive=True)
        except OSError:
            pass
        self.vacate()


def write_atomic(fs: Any, files: list[tuple[str, bytes]]) -> None:
    """Write every ``(path, data)`` of ``files`` whole, or none of them: each goes to a
    temporary file beside its target first, and only when all are written are they renamed
    into place, in order (so a reader that takes the last file as the mark of a complete
    set, a report's report.md, never sees a partial one). A write that fails -- a full
    disk, a read-only mount, a lost connection -- removes every temporary file and raises
    its OSError, leaving the targets as they were: never a truncated PNG or checkpoint.

    The one way fedray writes a finished file (run directories' files through
    fedray.state.run_dir, reports, plots). A target that exists and is not a regular file
    (a directory, /dev/null, a FIFO) is refused with an OSError: the rename would replace
    it (checked on local filesystems; an object store has neither)."""
    local = is_local(fs)
    temps: list[tuple[str, str]] = []
    try:
        for path, data in files:
            if local and fs.exists(path) and not fs.isfile(path):
                raise OSError(errno.EISDIR if fs.isdir(path) else errno.EINVAL,
                              "is a directory" if fs.isdir(path) else "not a regular file",
                              path)
            folder, _, base = path.rstrip("/").rpartition("/")
            tmp = f"{folder}/.{base[:100]}.{uuid.uuid4().hex}.tmp" if folder else \
                f".{base[:100]}.{uuid.uuid4().hex}.tmp"
            temps.append((tmp, path))
            with fs.open(tmp, "wb") as f:
                f.write(data)
        for tmp, path in temps:
            fs.mv(tmp, path)
    except BaseException:  # an interrupt too: no temporary file stays behind
        for tmp, _ in temps:
            try:
                if fs.exists(tmp):
                    fs.rm(tmp)
            except OSError:
                pass
        raise
