"""Profiles: where jobs go (this machine, a generic Slurm cluster, a Jean Zay-like one...).

    import dlokit
    dlokit.use_profile("local")                        # the embedded default
    dlokit.use_profile("jean-zay", account="abc@a100")

Profiles come from the kit's profiles.toml, then ~/.config/dlokit/profiles.toml, then
./dlokit_profiles.toml, then the file named by $DLOKIT_PROFILES (later files win).
"""
from __future__ import annotations

import getpass
import os
import re
import tomllib
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ..in_job import jobenv, untrusted

BUILTIN_FILE = Path(__file__).with_name("profiles.toml")


class ProfileError(ValueError):
    """A profile is unknown, incomplete or malformed."""


@dataclass(frozen=True)
class Profile:
    name: str
    backend: str  # "local" or "slurm"
    description: str = ""
    gpus_per_node: int | str = 4  # "auto" on the local backend
    cpus_per_task: int | str = 1
    gres_style: str = "gres"
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    hint_nomultithread: bool = False
    # every job asks for whole nodes (--exclusive), so that two measurements never share cores: for
    # nodes whose "GPUs" are not real and the training runs on the CPU (the project's local Slurm)
    exclusive_measurements: bool = False
    # --overcommit: more tasks than CPUs on a node (tasks share cores); for nodes with fewer cores than
    # (fake) GPUs, such as the project's local Slurm on a small machine. The batch script then asks for
    # --ntasks=T --nodes=N-(N+1) --use-min-nodes instead of --ntasks-per-node (which Slurm would refuse).
    overcommit: bool = False
    setup: tuple[str, ...] = ()
    python: str = ""
    log_dir: str = ""  # default: ./dlokit_jobs/<user>
    runs_dir: str = ""  # default: ./runs
    env: dict = field(default_factory=dict)  # extra environment for every job
    sbatch: dict = field(default_factory=dict)  # any other #SBATCH option, e.g. {reservation = "course"}
    required: tuple[str, ...] = ()
    # memory, in Slurm's words: `mem` per node (= the whole job on the local backend), or `mem_per_cpu`;
    # "16G", "512M", a number of MB. Slurm: --mem / --mem-per-cpu, empty = the cluster's default.
    # Local: a per-task RLIMIT_DATA, and the job's processes together (children, DataLoader workers) watched
    # by the launcher (dlokit.submission.tree_memory); "auto" = 80 % of the memory available when the job starts,
    # shared with the devices still free (measurements run one at a time); "0" = no limit.
    mem: str = ""
    mem_per_cpu: str = ""
    # the Imagenet Race (dlokit.race): GPUs per run, and its budget in GPU-hours, or in wall-clock minutes
    # (race_budget_minutes wins when both are set: a scaled-down budget for a local machine)
    race_gpus: int = 1
    race_budget_gpu_hours: float = 0.0
    race_budget_minutes: float = 0.0
    leaderboard_dir: str = ""  # the race's leaderboard folder, on a shared filesystem; default <runs>/leaderboard
    race_test_dir: str = ""  # the race's test split, readable by instructors only (python -m dlokit.classroom verify-race)
    # the instructors' Unix group: the class folders (log_dir's parent, runs_dir) are made setgid for it
    # (install -d -m 3777 -g GROUP), so that they read every student's logs and records; a student whose
    # folders are not is told so at their first submission
    instructors_group: str = ""

    @property
    def leaderboard(self) -> Path:
        return Path(self.leaderboard_dir).expanduser().absolute() if self.leaderboard_dir else self.runs / "leaderboard"

    @property
    def logs(self) -> Path:
        root = self.log_dir or os.environ.get(jobenv.LOG_DIR) or "dlokit_jobs"
        return (Path(root).expanduser() / getpass.getuser()).absolute()

    @property
    def runs(self) -> Path:
        root = self.runs_dir or os.environ.get(jobenv.RUNS_DIR) or "runs"
        return Path(root).expanduser().absolute()

    def node_gpus(self) -> int:
        """GPUs (or, on a CPU-only local machine, processes) one node offers."""
        if self.gpus_per_node != "auto":
            return int(self.gpus_per_node)
        import torch

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return torch.cuda.device_count() or max(1, min(cores, 8))

    def task_cpus(self, tasks_per_node: int) -> int:
        """Cores per task. "auto": the share of one device (one GPU, or one CPU "process-GPU") of this
        machine's cores, whatever the job's size, so that 1 and N tasks compare like 1 and N devices."""
        if self.cpus_per_task != "auto":
            return int(self.cpus_per_task)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores // max(1, self.node_gpus()))


MEMORY_PATTERN = re.compile(r"(\d+)\s*([KMGT]?)B?", re.IGNORECASE)


def memory_mb(value, label: str = "mem") -> int:
    """Slurm's memory syntax ("16G", "512M", "2048" = MB) -> MB; ProfileError with an example otherwise."""
    text = str(value).strip()
    match = MEMORY_PATTERN.fullmatch(text)
    if isinstance(value, bool) or not match:
        raise ProfileError(f"{label} {value!r} is not an amount of memory: write e.g. '16G', '512M' "
                           "or a number of megabytes")
    number, unit = int(match.group(1)), match.group(2).upper()
    return {"K": max(1, number // 1024) if number else 0, "": number, "M": number,
            "G": number * 1024, "T": number * 1024 ** 2}[unit]


def _check_memory(profile: "Profile") -> None:
    if profile.mem and profile.mem_per_cpu:
        raise ProfileError(f"profile {profile.name!r}: give mem or mem_per_cpu, not both (Slurm refuses both)")
    for key in ("mem", "mem_per_cpu"):
        value = str(getattr(profile, key)).strip()
        if not value:
            continue
        if value.lower() == "auto":
            if profile.backend != "local" or key != "mem":
                raise ProfileError(f"profile {profile.name!r}: {key} = 'auto' sizes local jobs to this machine; "
                                   "on Slurm give an amount such as '16G', or leave it empty for the cluster's default")
            continue
        memory_mb(value, f"profile {profile.name!r}: {key}")


def _profile_files() -> list[Path]:
    files = [BUILTIN_FILE, Path("~/.config/dlokit/profiles.toml").expanduser(), Path("dlokit_profiles.toml")]
    if os.environ.get(jobenv.PROFILES):
        files.append(Path(os.environ[jobenv.PROFILES]).expanduser())
    return [f for f in files if f.is_file()]


def load_profiles() -> dict[str, dict]:
    raw: dict[str, dict] = {}
    for path in _profile_files():
        try:  # a profile's `setup` lines run in every job: only this user's (or root's) files are profiles
            data = tomllib.loads(untrusted.read_text(path, owners=None if path == BUILTIN_FILE else {os.getuid(), 0}))
        except untrusted.Refused as error:  # e.g. a ./dlokit_profiles.toml another user left in a shared folder
            warnings.warn(f"profiles file not read: {error}", stacklevel=2)
            continue
        except tomllib.TOMLDecodeError as err:
            raise ProfileError(f"{path} is not valid TOML: {err}") from None
        for name, table in data.items():
            raw.setdefault(name, {}).update(table)
    return raw


def _resolve(name: str, raw: dict[str, dict], seen: tuple[str, ...] = ()) -> dict:
    if name not in raw:
        known = ", ".join(sorted(raw))
        raise ProfileError(f"unknown profile {name!r}; known profiles: {known}. "
                           "Add one in ~/.config/dlokit/profiles.toml or ./dlokit_profiles.toml.")
    if name in seen:
        raise ProfileError(f"profile {name!r} extends itself through {' -> '.join(seen)}")
    table = dict(raw[name])
    parent = table.pop("extends", None)
    return {**(_resolve(parent, raw, seen + (name,)) if parent else {}), **table}


def get_profile(name: str, **overrides) -> Profile:
    values = {**_resolve(name, load_profiles()), **{k: v for k, v in overrides.items() if v is not None}}
    known = {f.name for f in fields(Profile)} - {"name"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ProfileError(f"profile {name!r}: unknown setting(s) {', '.join(unknown)}; "
                           f"settings are: {', '.join(sorted(known))}")
    for key in ("setup", "required"):
        if key in values:
            values[key] = tuple(values[key])
    for key in ("mem", "mem_per_cpu"):
        if key in values and not isinstance(values[key], str):
            values[key] = str(values[key])
    profile = Profile(name=name, **values)
    if profile.backend not in ("local", "slurm"):
        raise ProfileError(f"profile {name!r}: backend must be 'local' or 'slurm', not {profile.backend!r}")
    _check_memory(profile)
    missing = [key for key in profile.required if not getattr(profile, key)]
    if missing:
        example = ", ".join(f"{key}='...'" for key in missing)
        raise ProfileError(f"profile {name!r} needs {', '.join(missing)}: call "
                           f"dlokit.use_profile({name!r}, {example}) or set it in ~/.config/dlokit/profiles.toml")
    if any(ch.isspace() for ch in str(profile.logs)):
        raise ProfileError(f"log folder {profile.logs} contains white space, which #SBATCH lines cannot carry; "
                           "set log_dir in the profile or DLOKIT_LOG_DIR to a path without spaces")
    return profile


_current: Profile | None = None


def use_profile(name: str | None = None, **overrides) -> Profile:
    """Choose where the next jobs go; returns the profile. Without a name: $DLOKIT_PROFILE or 'local'."""
    global _current
    _current = get_profile(name or os.environ.get(jobenv.PROFILE, "local"), **overrides)
    return _current


def current_profile() -> Profile:
    return _current or use_profile()


def with_overrides(profile: Profile, **overrides) -> Profile:
    return replace(profile, **{k: v for k, v in overrides.items() if v is not None})
