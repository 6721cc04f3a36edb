"""The leaderboard folder's files, read and written as untrusted input: every student writes there, everyone reads.

Reading: through dlokit.in_job.untrusted (a FIFO, a device, a folder or a link is refused, so nothing a student puts
there can make a reader hang), at most `max_bytes` of each, parsed as JSON, never unpickled; whose file it is is
returned with it, for the board to check.
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

from ..in_job import untrusted

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
        uid = os.lstat(path).st_uid
        return SharedFile(path.name, uid, value=untrusted.read_json(path, max_bytes, owners=untrusted.ANYONE))
    except untrusted.Refused as error:
        return SharedFile(path.name, uid, problem=error.why if "regular file" in error.why else f"unreadable ({error.why})")
    except OSError as error:
        return SharedFile(path.name, -1, problem=f"unreadable ({error.strerror})")


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
