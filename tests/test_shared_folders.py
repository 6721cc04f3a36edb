"""A user's part of a shared folder: theirs alone, or readable by the group of a setgid class folder."""
import stat

from dlokit.in_job import shared_folders


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_users_part_is_private_and_the_top_folder_open_to_all(tmp_path):
    part = shared_folders.private_part(tmp_path / "dlokit_jobs" / "me", "job logs")
    assert mode(part) == 0o700 and mode(part.parent) == 0o1777


def test_in_a_setgid_class_folder_the_group_reads_each_part(tmp_path):
    top = tmp_path / "jobs"
    top.mkdir()
    top.chmod(0o3777)  # as an instructor makes it: install -d -m 3777 -g INSTRUCTORS
    part = shared_folders.private_part(top / "me", "job logs")
    assert mode(part) == 0o2750  # setgid kept: what the jobs make inside belongs to the instructors group too
