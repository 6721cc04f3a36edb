"""Folders that several users share: a class's notebook folder on a workshop server, where every student's
kernel writes its job logs under `dlokit_jobs/<user>/` and its run records under `runs/`.

The folder above the users' parts is created open to all, as /tmp is (mode 1777: anyone may add, nobody may
remove or replace what another user wrote), so the second user can make their own part beside the first's.
A user's own part of the job logs (`dlokit_jobs/<user>/`: commands, logs, pickled tasks) is theirs alone
(0700; 0750 in a setgid class folder whose group is the instructors', for the class report), and must be
theirs: a folder made there by someone else is refused, never written into.
"""
from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from . import untrusted

OPEN_TO_ALL = 0o1777
PRIVATE = 0o700
GROUP_READS = 0o050  # r-x for the folder's group


class FolderError(PermissionError):
    """A folder the kit needs cannot be made or written; the message names it and what to do."""


def _owner(path: Path) -> str:
    return untrusted.user_name(path.stat().st_uid)


def _make(path: Path, mode: int, what: str, fix: str) -> None:
    """mkdir with exactly `mode` (the umask would take the sharing bits away)."""
    try:
        path.mkdir(mode=mode & 0o777, exist_ok=True)  # created with its mode: no chmod to drop an inherited setgid
    except FileExistsError:
        raise FolderError(f"{path} should be a folder ({what}) but is a file: remove or rename it") from None
    except PermissionError:
        raise FolderError(f"cannot create {path} ({what}): {path.parent} belongs to {_owner(path.parent)} and is "
                          f"not writable by you. {fix}") from None
    _set_mode(path, mode)


def _set_mode(path: Path, mode: int) -> None:
    """chmod only where the bits differ: a chmod by a user outside the folder's group drops the setgid bit that a
    class folder gave it, and with it the instructors' group of everything made inside."""
    info = path.stat()
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & ~stat.S_ISGID != mode:
        path.chmod(mode | stat.S_IMODE(info.st_mode) & stat.S_ISGID)


def shared_top(top: Path, what: str) -> Path:
    """`top` exists and this user can add to it: created open to all (1777) when the kit makes it."""
    fix = (f"Ask its owner (or an instructor) to run `chmod 1777 {top}`, or set log_dir / runs_dir in your "
           "profile (DLOKIT_LOG_DIR / DLOKIT_RUNS_DIR) to a folder of yours")
    if not top.is_dir():
        top.parent.mkdir(parents=True, exist_ok=True)
        parent = top.parent.stat()
        if parent.st_uid != os.getuid() and os.getuid() != 0:
            # made by this user, a folder every user shares would be theirs: as owner of a sticky folder they could
            # rename another user's part away and put their own in its place
            raise FolderError(f"{top} ({what}) does not exist, and {top.parent} belongs to {_owner(top.parent)}: a "
                              f"class folder's shared folders are made by an instructor. Ask them to run `python -m "
                              f"dlokit.classroom folders --group INSTRUCTORS` with your profile; or set log_dir / "
                              "runs_dir in your profile (DLOKIT_LOG_DIR / DLOKIT_RUNS_DIR) to a folder of yours")
        _make(top, OPEN_TO_ALL, what, fix)
    if not os.access(top, os.W_OK | os.X_OK):
        raise FolderError(f"cannot write in {top} ({what}): it belongs to {_owner(top)} (mode "
                          f"{stat.S_IMODE(top.stat().st_mode):o}). {fix}")
    return top


def private_mode(parent: Path) -> int:
    """The mode of a user's own folder in `parent`: theirs alone (0700), or also read by the group of a class
    folder an instructor made setgid for the instructors' group (`install -d -m 3777 -g INSTRUCTORS`: everyone
    adds, the new folders take that group), so the instructors read every student's part (0750, setgid kept)."""
    return PRIVATE | (GROUP_READS if parent.stat().st_mode & stat.S_ISGID else 0)


def make_private(path: Path) -> Path:
    """A folder of this user's, made (or left) with the mode of a user's own part (see private_mode)."""
    mode = private_mode(path.parent)
    path.mkdir(mode=mode, exist_ok=True)
    if path.lstat().st_uid != os.getuid():
        raise FolderError(f"{path} belongs to {_owner(path)}, not to you: another user made it before your job could, "
                          "and the kit does not write your records into it. Show it to your instructor")
    _set_mode(path, mode)
    return path


def private_part(path: Path, what: str) -> Path:
    """`path` (a user's own part, in a shared top folder) exists, belongs to this user and is theirs alone (or
    read by the instructors' group too, see private_mode)."""
    shared_top(path.parent, what)
    _make(path, private_mode(path.parent), what, "")
    if path.stat().st_uid != os.getuid():
        raise FolderError(f"{path} ({what}) belongs to {_owner(path)}, not to you: the kit does not write your jobs "
                          f"into another user's folder. Ask them to remove it, or set log_dir in your profile "
                          "(DLOKIT_LOG_DIR) to a folder of yours")
    return path


def read_by_group(top: Path, group: str) -> bool:
    """Is `top` a class folder whose users' parts `group` reads (setgid for that group, see private_mode)?"""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    info = top.stat()
    return bool(info.st_mode & stat.S_ISGID) and info.st_gid == gid


CLASS_FOLDER = 0o3777  # setgid (new parts take the instructors' group), sticky (nobody removes another's file), open


def make_class_folder(path: Path, group: str) -> Path:
    """The instructors' set-up of one class folder (`python -m dlokit.classroom folders`): made, or put right,
    mode 3777 and group `group`, as `install -d -m 3777 -g GROUP` does. Run it as root or as a member of `group`."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise FolderError(f"no group {group!r}: create it first (`groupadd {group}`) and add the instructors") from None
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.chown(path, -1, gid)
        path.chmod(CLASS_FOLDER)
    except PermissionError:
        raise FolderError(f"cannot give {path} to group {group} with mode 3777: run this as root or as its owner "
                          f"({_owner(path)}), being a member of {group}") from None
    return path
