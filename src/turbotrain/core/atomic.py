"""Atomic writes of every artifact (checkpoints, summary, export files, caches, handshakes).

A writer fills a temp file beside the target, fsyncs it, and os.replace()s it over the target:
readers never see a partial file under the final name, and a failed or killed write leaves the
previous file as it was. Temp names carry the writer's pid, so a later run can tell the temps
of a dead writer (safe to delete) from those of a live one (another run's write in progress).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from turbotrain.core.errors import UserError

_TEMP = re.compile(r"^\..+\.tmp(\d+)$")


class WriteError(UserError, RuntimeError):
    """An artifact could not be written (disk full, permissions, I/O error); the message names the
    path and says what was kept."""


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call `write(f)` on a temp file, fsync, and move it over `path`."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as error:
        e = _os_error(error)
        if e is None:
            raise
        kept = f"the previous {path.name} was kept" if path.exists() else f"no {path.name} was written"
        reason = os.strerror(e.errno) if e.errno else str(e)
        hint = "; free some space and resume" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise WriteError(f"could not write {path}: {reason} ({kept}){hint}") from e
    finally:
        _drop(tmp)
    _fsync_dir(path.parent)


def _drop(tmp: Path) -> None:
    """Remove a temp file if one was made: none was where the folder is a file (ENOTDIR), and
    unlink's error would hide the write's own."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        tmp.unlink()


def _os_error(error: BaseException | None) -> OSError | None:
    """The OSError behind `error`: torch.save's zip writer reports a failed write (ENOSPC) as a
    RuntimeError raised while it handles the OSError."""
    while error is not None and not isinstance(error, OSError):
        error = error.__context__
    return error


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def atomic_write_link(source: str | Path, path: str | Path) -> None:
    """Make `path` a hard link of `source`, replacing what was there in one step."""
    path = Path(path)
    tmp = temp_path(path)
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
        os.replace(tmp, path)
    finally:
        _drop(tmp)
    _fsync_dir(path.parent)


def atomic_write_dir(path: str | Path, fill: Callable[[Path], None], replace: bool = True) -> bool:
    """Call `fill(folder)` on a temp folder beside `path`, then swap it in for `path`: readers
    see the old folder or the new one, never a mix; a failed fill leaves the old one as it was.
    With `replace=False` a `path` that another process made meanwhile is kept (a folder others
    may have memory-mapped: on NFS, replacing it under them is ESTALE or SIGBUS) and ours dropped.
    Temp names carry host and pid: processes of several nodes may share the parent folder.
    Returns whether ours is the one at `path`."""
    path = Path(path)
    me = f"{socket.gethostname()}-{os.getpid()}"
    tmp, old = path.with_name(f".{path.name}.tmp-{me}"), path.with_name(f".{path.name}.old-{me}")
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        if not replace:
            return _rename_unless_there(tmp, path)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(path.parent)
    return True


def _rename_unless_there(tmp: Path, path: Path) -> bool:
    try:
        os.rename(tmp, path)  # a folder onto a non-empty folder fails: never replaces it
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        return False
    return True


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (a power cut after replace() could otherwise undo it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the data itself is synced
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(directory: str | Path) -> list[str]:
    """Delete temp files whose writer is dead (kill -9 skips the cleanup); a live writer's temp (a
    concurrent run writing into the same dir) is left alone. Returns the names removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = []
    for p in sorted(directory.iterdir()):
        m = _TEMP.match(p.name)
        if m and not _alive(int(m.group(1))):
            p.unlink(missing_ok=True)
            stale.append(p.name)
    return stale
