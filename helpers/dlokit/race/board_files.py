"""The leaderboard folder's files, read and written as untrusted input: every student writes there, everyone reads.

Reading: only regular files are opened (a FIFO, a device, a folder or a link is skipped unopened, so nothing a
student puts there can make a reader hang), at most `max_bytes` of each, parsed as JSON, never unpickled.
Writing: a temporary file of this process, renamed over the wanted name; when another user holds that name (a
squatted name in a sticky folder), under a name nobody could have guessed; the temporary file never stays behind.
Who is trusted to publish the instructors' check: root, the folder's owner, and, in a class folder (setgid), the
members of its group (the instructors: `python -m dlokit.classroom folders`).
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_ENTRY_BYTES = 64 * 1024


@dataclass
class SharedFile:
    name: str
    uid: int
    value: object = None  # the parsed JSON, when `problem` is None
    problem: str | None = None


def read_json_files(folder: Path, prefix: str = "", max_bytes: int = MAX_ENTRY_BYTES) -> list[SharedFile]:
    """Every `<prefix>*.json` in `folder`, sorted by name, each parsed or with why it was not."""
    try:
        names = sorted(name for name in os.listdir(folder) if name.startswith(prefix) and name.endswith(".json"))
    except OSError:  # no folder (yet), or not readable
        return []
    return [_read_one(Path(folder) / name, max_bytes) for name in names]


def _read_one(path: Path, max_bytes: int) -> SharedFile:
    try:
        info = os.lstat(path)
    except OSError as error:
        return SharedFile(path.name, -1, problem=f"unreadable ({error.strerror})")
    if not stat.S_ISREG(info.st_mode):
        return SharedFile(path.name, info.st_uid, problem="not a regular file (a FIFO, a link or a device): skipped "
                                                          "unopened")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        return SharedFile(path.name, info.st_uid, problem=f"unreadable ({error.strerror})")
    with os.fdopen(fd, "rb") as handle:
        opened = os.fstat(handle.fileno())  # the file itself, not whatever the name pointed to at lstat
        if not stat.S_ISREG(opened.st_mode):
            return SharedFile(path.name, opened.st_uid, problem="not a regular file: skipped")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        return SharedFile(path.name, opened.st_uid, problem=f"larger than {max_bytes // 1024} KiB: not an entry")
    try:
        return SharedFile(path.name, opened.st_uid, value=json.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        return SharedFile(path.name, opened.st_uid, problem=f"unreadable ({type(error).__name__})")


def write_json(folder: Path, name: str, value) -> Path:
    """`value` as `folder/name`, atomically (readable by all); under `<stem>.<random>.json` when another user
    holds `name`. Returns the path written."""
    folder = Path(folder)
    token = secrets.token_hex(6)
    tmp = folder / f".{name}.{os.getpid()}.{token}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o644)  # whatever the umask: every student reads the board
            json.dump(value, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        for target in (folder / name, folder / f"{Path(name).stem}.{token}.json"):
            try:
                os.replace(tmp, target)
                return target
            except (PermissionError, IsADirectoryError):  # the name is another user's (sticky folder), or a folder
                continue
        raise PermissionError(f"cannot write {name} in {folder}")
    finally:
        tmp.unlink(missing_ok=True)


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def trusted_uids(folder: Path) -> set[int]:
    """Who may publish what every student then reads: root, the folder's owner, and in a class folder (setgid)
    the members of its group."""
    try:
        info = os.stat(folder)
    except OSError:
        return {0}
    uids = {0, info.st_uid}
    if info.st_mode & stat.S_ISGID:
        try:
            group = grp.getgrgid(info.st_gid)
        except KeyError:
            return uids
        for user in pwd.getpwall():
            if user.pw_gid == info.st_gid or user.pw_name in group.gr_mem:
                uids.add(user.pw_uid)
    return uids
