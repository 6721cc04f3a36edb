"""The one way to read a file another user can have written: run records, metrics, summaries, job cards, notes,
logs, leaderboard entries, the instructors' check, checkpoints, executed notebooks.

A class folder is shared: a student can put a FIFO (a reader would block on it for ever), a link (to read or to
forge another file), a folder, a device, a 2 GB file or a file of the wrong owner where a reader expects a record.
So every such file is opened once, here: without following a link and without blocking (O_NOFOLLOW | O_NONBLOCK),
then fstat'ed: it must be a regular file, owned by one of the users the caller names, and no larger than the
caller's bound (by default: the owner of the folder it lies in, since a user's own folders are theirs alone; a
folder every user adds to, like the leaderboard's, says ANYONE and checks who wrote what itself). What is refused raises Refused, whose message names the file and why; a missing file raises
FileNotFoundError as open() does. Nothing here unpickles: callers parse JSON or load weights only.
"""
from __future__ import annotations

import errno
import json
import os
import pwd
import stat
import unicodedata
from contextlib import contextmanager
from pathlib import Path

KIB, MIB = 1024, 1024 ** 2
NOTE_BYTES = 4 * MIB  # a job card, a usage note, run.json, summary.json: the kit writes a few KiB
METRICS_BYTES = 64 * MIB  # a metrics.jsonl: ~200 bytes a step, so 300,000 steps
NOTEBOOK_BYTES = 64 * MIB  # an executed notebook with its plots
FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


FOLDER_OWNER = "the folder's owner"  # owners=FOLDER_OWNER: the uid of the folder the file lies in
ANYONE = None  # owners=ANYONE: any user (the caller checks the uid itself)


class Refused(OSError):
    """A file that is not read: str() is '<path>: <why>'."""

    def __init__(self, path, why: str):
        super().__init__(errno.EPERM, why, str(path))
        self.path, self.why = Path(path), why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def kind(mode: int) -> str:
    """'a FIFO', 'a folder'...: what a non-regular file is, for messages."""
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def _owners_text(owners) -> str:
    return " or ".join(sorted(user_name(uid) for uid in owners))


def check_owner(path, info: os.stat_result, owners) -> None:
    if owners == FOLDER_OWNER:
        owners = {os.lstat(os.path.dirname(os.path.abspath(path))).st_uid}
    if owners is not None and info.st_uid not in owners:
        raise Refused(path, f"belongs to {user_name(info.st_uid)}, not to {_owners_text(owners)}: not read")


@contextmanager
def open_regular(path, limit: int, owners=FOLDER_OWNER):
    """The file opened for reading (binary), once it is known to be a regular file of one of `owners` (a set of uids,
    FOLDER_OWNER or ANYONE) of at most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Refused(path, "a symbolic link, not a regular file: not followed") from None
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path)) from None
        raise Refused(path, f"cannot be opened ({error.strerror or error})") from None
    try:
        info = os.fstat(fd)  # the file itself, whatever its name points to now
        if not stat.S_ISREG(info.st_mode):
            raise Refused(path, f"{kind(info.st_mode)}, not a regular file: not read")
        check_owner(path, info, owners)
        if info.st_size > limit:
            raise Refused(path, f"{_size(info.st_size)}, over the {_size(limit)} a file of this kind may hold: not read")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        yield handle


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / KIB:.1f} KiB" if n >= KIB else f"{n} bytes"


def read_bytes(path, limit: int = NOTE_BYTES, owners=FOLDER_OWNER) -> bytes:
    """The whole file (see open_regular); a file that grew past `limit` while read is refused too."""
    with open_regular(path, limit, owners) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise Refused(path, f"grew past {_size(limit)} while read: not read")
    return data


def read_tail(path, limit: int, owners=FOLDER_OWNER) -> bytes:
    """The last `limit` bytes of a regular file of any size (a job's log)."""
    with open_regular(path, 1 << 62, owners) as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
        return handle.read(limit)


def read_text(path, limit: int = NOTE_BYTES, owners=FOLDER_OWNER) -> str:
    """The file as strict UTF-8 text; Refused naming the first bad byte."""
    data = read_bytes(path, limit, owners)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Refused(path, f"not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})") from None


def read_json(path, limit: int = NOTE_BYTES, owners=FOLDER_OWNER):
    """The JSON value the file holds; Refused when it is not JSON."""
    text = read_text(path, limit, owners)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        where = f" (line {error.lineno}, column {error.colno})" if isinstance(error, json.JSONDecodeError) else ""
        raise Refused(path, f"not JSON{where}") from None


def folder_owner(path) -> int:
    """The uid of a folder (not followed if a link); Refused when it is not a folder, FileNotFoundError if absent."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise Refused(path, f"{kind(info.st_mode)}, not a folder: not read")
    return info.st_uid


def check_folder(path, owners) -> None:
    """`path` is a folder (not a link) of one of `owners`; Refused naming who owns it otherwise."""
    uid = folder_owner(path)
    if owners is not None and uid not in owners:
        raise Refused(path, f"belongs to {user_name(uid)}, not to {_owners_text(owners)}: not read")


def printable(value, limit: int = 600, lines: bool = False) -> str:
    """Another user's text as a terminal or a table may show it: control characters (escape sequences; newlines too
    unless `lines`) made spaces, at most `limit` characters."""
    text = "".join(" " if unicodedata.category(ch) in ("Cc", "Cf") and not (lines and ch == "\n") else ch
                   for ch in str(value))
    return text if len(text) <= limit else text[:limit - 1] + "…"
