"""Writing output files safely: checked before the work starts, replaced atomically.

Light on imports (no xarray), so that ``bayesprism ingest`` can use it. A write goes to a
hidden temporary in the target folder, ``.NAME.<pid>.tmp``, renamed over ``NAME`` when
complete; a failed or interrupted write removes its temporary, and one left by a killed process
(its pid gone) is removed by the next write of the same file. The CLI turns SIGTERM and SIGHUP
into an exception (:func:`terminate_as_exception`), so that a process stopped by ``kill``,
a batch scheduler or a closed terminal removes its temporary too; only SIGKILL leaves one, for
the next write to remove.
"""

from __future__ import annotations

import glob
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bayesprism.errors import InputError, Problem


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM or SIGHUP inside :func:`terminate_as_exception`.

    A ``SystemExit`` (not an ``Exception``), so that no ``except Exception`` swallows it; its
    ``code`` is the shell's 128 + signal number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


@contextmanager
def terminate_as_exception() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` for the block, handlers restored after.

    Python's default for these signals ends the process at once, running no ``finally``, so
    an atomic write stopped by ``kill`` left its temporary behind. As an exception, the
    write's cleanup runs. Outside the main thread (where signals cannot be handled) the
    block runs unchanged.

    Examples
    --------
    >>> with terminate_as_exception():
    ...     signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    True
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame) -> None:
        raise Terminated(signum)

    signals = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _temp_path(path: Path, pid: int) -> Path:
    """The temporary name a write of ``path`` by process ``pid`` uses (same folder, hidden)."""
    return path.with_name(f".{path.name}.{pid}.tmp")


def _remove_stale_temps(path: Path) -> None:
    """Delete temporaries of ``path`` left by killed writers (their process is gone)."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid_text = tmp.name[len(path.name) + 2:-len(".tmp")]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except OSError:
            continue  # alive under another user, or unknowable: leave it


def check_output_path(path: str | os.PathLike, option: str = "-o") -> Path:
    """Refuse an output path that cannot be written, before any work starts.

    Parameters
    ----------
    path
        The file to be written.
    option
        The command-line option or argument that gave it, named in the message.

    Returns
    -------
    pathlib.Path
        ``path`` as a Path.

    Raises
    ------
    InputError
        If ``path`` is a directory, its folder does not exist or is not a folder, or the
        folder cannot be written.
    """
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        message = "is a directory; give a file name (e.g. DIR/out.ext)"
    elif not folder.is_dir():
        message = ("the output folder does not exist" if not folder.exists()
                   else "the output folder is not a directory")
    elif not os.access(folder, os.W_OK | os.X_OK):
        message = "the output folder is not writable"
    else:
        return path
    raise InputError(Problem(str(path), option, message))


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Write ``path`` through a temporary file in its folder renamed over it at the end.

    A failed or interrupted write leaves the old file intact and removes its temporary; a
    temporary left by a killed process is removed by the next write of the same path.

    Parameters
    ----------
    path
        Target file; its folder must exist.
    write
        Called with the temporary path; writes the whole content there.

    Returns
    -------
    pathlib.Path
        The written path.
    """
    path = check_output_path(path, "output")
    _remove_stale_temps(path)
    tmp = _temp_path(path, os.getpid())
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_atomic`)."""
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
