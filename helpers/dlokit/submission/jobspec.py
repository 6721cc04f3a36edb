"""A job, described once and checked before anything is written or submitted.

JobSpec holds what a notebook cell asks for; `plan(spec, profile)` validates it against the profile
and returns the node layout; `sbatch_preview` renders the batch script submitit would send;
`cluster_limits` asks a Slurm cluster what its partitions and nodes offer and `check_fits` refuses a
layout or a time limit that could never start there.
"""
from __future__ import annotations

import getpass
import math
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .profiles import Profile, memory_mb

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MODULE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+/-]*")
TIME_PATTERN = re.compile(r"(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})")


class JobSpecError(ValueError):
    """What a cell asked for cannot be submitted; the message says what to change."""


@dataclass(frozen=True)
class JobSpec:
    script: str
    args: tuple[str, ...] = ()
    name: str = "dlokit"
    n_gpu: int = 1
    n_gpu_per_task: int = 1
    time_max: str = "00:10:00"
    module: str | None = None
    qos: str | None = None
    partition: str | None = None
    constraint: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    exclusive: bool = False
    alone: bool = True  # False: measures accuracy, not speed: may share the machine with other such jobs
    env: dict = field(default_factory=dict)
    expected: dict = field(default_factory=dict)  # {state: why} of a job meant to fail (jobs.expected_ends); {}: COMPLETED

    @classmethod
    def from_command(cls, command: str | list[str], **kwargs) -> "JobSpec":
        """'train.py --batch-size 64' (shell-like quoting) or ['train.py', '--batch-size', '64']."""
        if isinstance(command, str):
            try:
                argv = shlex.split(command)
            except ValueError as err:
                raise JobSpecError(f"cannot split command {command!r}: {err}") from None
        else:
            argv = [str(a) for a in command]
        if not argv:
            raise JobSpecError("empty command: give the training script, e.g. 'train_classifier.py --test'")
        return cls(script=argv[0], args=tuple(argv[1:]), **kwargs)

    @property
    def argv(self) -> list[str]:
        return [self.script, *self.args]

    @property
    def command_line(self) -> str:
        return shlex.join(["python", "-u", *self.argv])


@dataclass(frozen=True)
class Layout:
    n_gpu: int
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    time_seconds: int

    @property
    def time_minutes(self) -> int:
        """Slurm counts whole minutes."""
        return math.ceil(self.time_seconds / 60)

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node

    def summary(self, name: str) -> str:
        unit = "GPU" if self.gpus_per_node else "process"
        return (f"{name}: {_count(self.n_gpu, unit)} on {_count(self.nodes, 'node')} - "
                f"{_count(self.tasks, 'task')} ({self.tasks_per_node} per node), "
                f"{_count(self.cpus_per_task, 'CPU')} per task, time limit {format_seconds(self.time_seconds)}")


def _count(number: int, word: str) -> str:
    plural = word + ("es" if word.endswith("s") else "s")
    return f"{number} {word if number == 1 else plural}"


def parse_time(value: str | int) -> int:
    """'HH:MM:SS', 'D-HH:MM:SS' or a number of minutes -> seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value * 60
    else:
        text = str(value).strip()
        match = TIME_PATTERN.fullmatch(text)
        if not match:
            raise JobSpecError(f"time_max {value!r} is not a time: write 'HH:MM:SS' (e.g. '00:30:00') "
                               "or 'D-HH:MM:SS', or give minutes as an integer")
        days, hours, mins, secs = (int(g or 0) for g in match.groups())
        if mins >= 60 or secs >= 60:
            raise JobSpecError(f"time_max {value!r}: minutes and seconds must be below 60")
        seconds = days * 86400 + hours * 3600 + mins * 60 + secs
    if seconds <= 0:
        raise JobSpecError(f"time_max {value!r} must be positive")
    return seconds


def format_seconds(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def check_name(name: str, label: str = "job name") -> None:
    """`label`: what the cell calls it (a notebook's NICKNAME becomes the job name)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise JobSpecError(f"{label} {name!r}: use 1-64 letters, digits, '.', '_' or '-' starting with a "
                           "letter or digit (it becomes a file name and a squeue filter), e.g. 'alice'")


def _check_int(label: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise JobSpecError(f"{label} must be a whole number >= {minimum}, not {value!r}")
    return value


def plan(spec: JobSpec, profile: Profile) -> Layout:
    """Check a job against a profile and lay it out on nodes; raises JobSpecError with advice."""
    check_name(spec.name)
    n_gpu = _check_int("n_gpu (number of GPUs)", spec.n_gpu)
    per_task = _check_int("n_gpu_per_task", spec.n_gpu_per_task)
    seconds = parse_time(spec.time_max)
    if spec.module is not None and not MODULE_PATTERN.fullmatch(spec.module):
        raise JobSpecError(f"module {spec.module!r} is not a module name (letters, digits, '_.+/-')")
    if not spec.script.endswith(".py"):
        raise JobSpecError(f"{spec.script!r} is not a Python script: the command must start with a .py file")
    if profile.backend == "local" or Path(spec.script).is_absolute() or Path(spec.script).exists():
        if not Path(spec.script).is_file():
            raise JobSpecError(f"script {spec.script!r} not found (looked in {Path.cwd()}); "
                               "check the path relative to the notebook's folder")

    node_gpus = profile.node_gpus()
    if n_gpu <= node_gpus:
        nodes, gpus_on_node = 1, n_gpu
    elif profile.backend == "local":
        offers = (f"{node_gpus} GPU(s)" if _local_gpu_count() or profile.gpus_per_node != "auto" else
                  f"no GPU, and {node_gpus} CPU process(es) standing for GPUs (one per core, at most 8)")
        raise JobSpecError(f"{n_gpu} GPUs asked but this machine offers {offers}; "
                           "use a Slurm profile (dlokit.use_profile('slurm', ...)) for more")
    elif n_gpu % node_gpus:
        lower, upper = n_gpu // node_gpus * node_gpus, (n_gpu // node_gpus + 1) * node_gpus
        offer = f"{lower} or {upper}" if upper <= _most_gpus(profile, node_gpus, spec.partition) else f"{lower} (at most)"
        raise JobSpecError(f"{n_gpu} GPUs do not fill whole nodes of {node_gpus} GPUs "
                           f"(profile {profile.name!r}); ask for {offer}")
    else:
        nodes, gpus_on_node = n_gpu // node_gpus, node_gpus
    if gpus_on_node % per_task:
        raise JobSpecError(f"n_gpu_per_task={per_task} does not divide the {gpus_on_node} GPUs of a node")
    tasks_per_node = gpus_on_node // per_task
    cpus = spec.cpus_per_task if spec.cpus_per_task is not None else profile.task_cpus(tasks_per_node)
    _check_int("cpus_per_task", cpus)
    if profile.backend == "local":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if tasks_per_node * cpus > cores:
            raise JobSpecError(f"{tasks_per_node} task(s) x cpus_per_task={cpus} = {tasks_per_node * cpus} cores asked but "
                               f"this machine has {cores} (profile {profile.name!r}): ask for fewer cores per task, "
                               "or cpus_per_task='auto'")
    local_gpus = profile.backend == "local" and profile.gpus_per_node == "auto" and _local_gpu_count() == 0
    return Layout(n_gpu=n_gpu, nodes=nodes, gpus_per_node=0 if local_gpus else gpus_on_node,
                  tasks_per_node=tasks_per_node, cpus_per_task=cpus, time_seconds=seconds)


def _most_gpus(profile: Profile, node_gpus: int, partition: str | None) -> float:
    """The most GPUs one job can have on the profile's cluster, in whole nodes (inf when it cannot be asked)."""
    try:
        partitions = cluster_limits(profile).values()
    except ClusterQueryError:
        return math.inf
    wanted = partition or profile.partition
    if wanted:
        partitions = [p for p in partitions if p.name == wanted] or partitions
    nodes = [min(len(p.nodes), p.max_nodes or len(p.nodes)) for p in partitions]
    return max(nodes, default=0) * node_gpus


def _local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def slurm_parameters(spec: JobSpec, profile: Profile, layout: Layout) -> dict:
    """The SlurmExecutor parameters (without the 'slurm_' prefix) for this job."""
    params: dict = {
        "job_name": spec.name,
        "nodes": layout.nodes,
        "ntasks_per_node": layout.tasks_per_node,
        "cpus_per_task": layout.cpus_per_task,
        "time": layout.time_minutes,
        "signal_delay_s": min(90, max(5, layout.time_seconds // 10)),  # submitit's warning before the limit
        "setup": setup_lines(spec, profile)[0],
        # a task that fails ends the step: the others would wait in their next collective until a timeout
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    if profile.gres_style == "gpus-per-node":
        params["gpus_per_node"] = layout.gpus_per_node
    else:
        params["gres"] = f"gpu:{layout.gpus_per_node}"
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(spec, key) or getattr(profile, key)
        if value:
            params[key] = str(value)
    if spec.exclusive or (profile.exclusive_measurements and spec.alone):
        params["exclusive"] = True
    if profile.mem:
        params["mem"] = str(profile.mem).strip()
    elif profile.mem_per_cpu:
        params["mem_per_cpu"] = str(profile.mem_per_cpu).strip()
    overcommit = {}
    if profile.overcommit:
        # Slurm still wants tasks x cpus CPUs per node from --ntasks-per-node, or from --nodes=N --ntasks=T
        # (it derives the tasks per node), even with --overcommit; --ntasks with a node range does not.
        overcommit = {"overcommit": True, "ntasks": layout.tasks, "nodes": f"{layout.nodes}-{layout.nodes + 1}",
                      "use_min_nodes": True}
        del params["ntasks_per_node"]
    extra = {**({"hint": "nomultithread"} if profile.hint_nomultithread else {}), **overcommit, **profile.sbatch}
    if extra:
        params["additional_parameters"] = extra
    for key, value in {**params, **extra}.items():
        if isinstance(value, str) and any(ch in value for ch in "\n\r"):
            raise JobSpecError(f"{key} {value!r} contains a line break")
    return params


def uses_modules(lines) -> bool:
    return any(line.split()[:1] == ["module"] for line in lines)


def setup_lines(spec: JobSpec, profile: Profile) -> tuple[list[str], str]:
    """The shell lines run before srun, and a notice for the cell ('' if none).

    A cell's `module` replaces the profile's last `module load` line (one PyTorch module, not two);
    on a profile without environment modules it is left out, so cells written for the original
    course still run unchanged."""
    lines = list(profile.setup)
    if not spec.module:
        return lines, ""
    loads = [i for i, line in enumerate(lines) if line.split()[:2] == ["module", "load"]]
    if not loads:
        return lines, (f"note: module {spec.module!r} left out: profile {profile.name!r} loads no modules "
                       "(its nodes use the Python environment set in the profile)")
    lines[loads[-1]] = f"module load {shlex.quote(spec.module)}"
    return lines, ""


def sbatch_preview(spec: JobSpec, profile: Profile, folder: str | Path | None = None) -> str:
    """The batch script submitit would write for this job (nothing is written or submitted)."""
    from submitit.slurm.slurm import _make_sbatch_string

    layout = plan(spec, profile)
    folder = Path(folder or profile.logs / spec.name)
    python = profile.python or "python"
    command = f"{shlex.quote(python)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    script = _make_sbatch_string(command=command, folder=folder, **slurm_parameters(spec, profile, layout))
    return f"{script}\n# every task then runs (argv passed as a list, no shell): {spec.command_line}\n"


# ---- what a Slurm cluster offers ------------------------------------------------------------------

class ClusterQueryError(RuntimeError):
    """The cluster could not be asked (no scontrol, no controller, an answer not understood)."""


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    gpus: int
    mem_mb: int
    gres: str


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_time_s: int | None  # None: UNLIMITED
    max_nodes: int | None
    max_mem_per_node_mb: int | None
    nodes: tuple[Node, ...]


_cluster_cache: dict[tuple, dict[str, Partition]] = {}


def _scontrol(*args: str) -> list[dict]:
    """`scontrol show ... -o`: one dict of key=value per line."""
    try:
        done = subprocess.run(["scontrol", "show", *args, "-o"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ClusterQueryError(f"scontrol show {' '.join(args)}: {err}") from None
    if done.returncode:
        raise ClusterQueryError(f"scontrol show {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    rows = []
    for line in done.stdout.splitlines():
        row = {}
        for item in re.split(r"\s+(?=[A-Za-z/:]+=)", line.strip()):
            key, _, value = item.partition("=")
            row[key] = value
        if row:
            rows.append(row)
    return rows


def slurm_seconds(text: str) -> int | None:
    """Slurm's time limits ('1-00:00:00', '2:00:00', '30:00', '60', 'UNLIMITED') -> seconds, None if unlimited."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = parts
    elif len(parts) == 2:  # minutes:seconds
        hours, (minutes, seconds) = 0, parts
    else:  # minutes
        hours, minutes, seconds = 0, parts[0], 0
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def _limit(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _gres_gpus(gres: str) -> int:
    """'gpu:4', 'gpu:a100:8(S:0-1)', 'gpu:2,shard:8' -> GPUs on the node."""
    return sum(int(n) for n in re.findall(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres or ""))


def cluster_limits(profile: Profile) -> dict[str, Partition]:
    """The cluster's partitions with their nodes, asked once per profile and cluster in a session."""
    key = (profile.name, os.environ.get("SLURM_CONF", ""))
    if key not in _cluster_cache:
        nodes = {}
        for row in _scontrol("node"):
            try:
                nodes[row["NodeName"]] = (row.get("Partitions", ""), Node(
                    name=row["NodeName"], cpus=int(row.get("CPUTot") or row.get("CPUEfctv") or 0),
                    gpus=_gres_gpus(row.get("Gres", "")), mem_mb=int(row.get("RealMemory") or 0),
                    gres=row.get("Gres", "")))
            except (KeyError, ValueError) as err:
                raise ClusterQueryError(f"cannot read scontrol's node line ({err})") from None
        partitions = {}
        for row in _scontrol("partition"):
            name = row.get("PartitionName", "")
            members = tuple(node for parts, node in nodes.values() if name in parts.split(","))
            try:
                max_time = slurm_seconds(row.get("MaxTime", "UNLIMITED"))
            except ValueError:
                max_time = None
            partitions[name] = Partition(name=name, default=row.get("Default") == "YES", max_time_s=max_time,
                                         max_nodes=_limit(row.get("MaxNodes")),
                                         max_mem_per_node_mb=_limit(row.get("MaxMemPerNode")), nodes=members)
        if not partitions:
            raise ClusterQueryError("scontrol lists no partition")
        _cluster_cache[key] = partitions
    return _cluster_cache[key]


_accounts_cache: dict[tuple, list[str]] = {}


def user_accounts(profile: Profile) -> list[str]:
    """The Slurm accounts this user may charge (their associations in sacctmgr), asked once per session."""
    key = (profile.name, os.environ.get("SLURM_CONF", ""))
    if key not in _accounts_cache:
        command = ["sacctmgr", "-n", "-P", "show", "associations", f"user={getpass.getuser()}", "format=account"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ClusterQueryError(f"sacctmgr: {err}") from None
        if done.returncode:
            raise ClusterQueryError(f"sacctmgr: {(done.stderr or done.stdout).strip()}")
        _accounts_cache[key] = sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})
    return _accounts_cache[key]


def check_account(spec: JobSpec, profile: Profile) -> None:
    """Refuse an account this user has no association with (Slurm would refuse it, or, without
    AccountingStorageEnforce, charge the hours to another account without a word)."""
    account = spec.account or profile.account
    accounts = user_accounts(profile) if account else []
    if accounts and account not in accounts:
        raise JobSpecError(f"account {account!r} is not one of yours on this cluster; you may charge: "
                           f"{', '.join(accounts)}. Set account= in the call, or in profile {profile.name!r}")


def _plural(number: int, word: str) -> str:
    return f"{number} {word}{'' if number == 1 else 's'}"


def check_fits(spec: JobSpec, profile: Profile, layout: Layout, partitions: dict[str, Partition]) -> None:
    """Refuse, naming the limit, a job that no partition node could ever start (it would stay PENDING)."""
    wanted = spec.partition or profile.partition
    if wanted:
        if wanted not in partitions:
            raise JobSpecError(f"partition {wanted!r} does not exist on this cluster; "
                               f"its partitions are: {', '.join(sorted(partitions))}")
        part = partitions[wanted]
    else:
        part = next((p for p in partitions.values() if p.default), None)
        if part is None:
            return  # no default partition: sbatch itself will say so
    where = f"partition {part.name!r}"
    if part.max_time_s is not None and layout.time_seconds > part.max_time_s:
        raise JobSpecError(f"time_max {spec.time_max!r} ({format_seconds(layout.time_seconds)}) is longer than "
                           f"{where} allows (MaxTime {format_seconds(part.max_time_s)}): ask for at most that")
    if not part.nodes:
        return
    cpus = layout.cpus_per_task * (1 if profile.overcommit else layout.tasks_per_node)
    mem = None
    if profile.mem and str(profile.mem).strip() not in ("0", ""):
        mem = memory_mb(profile.mem)
    elif profile.mem_per_cpu:
        mem = memory_mb(profile.mem_per_cpu) * cpus
    most_gpus = max(n.gpus for n in part.nodes)
    most_cpus = max(n.cpus for n in part.nodes)
    most_mem = max(n.mem_mb for n in part.nodes)
    count = len(part.nodes) if part.max_nodes is None else min(len(part.nodes), part.max_nodes)
    if layout.nodes > count:
        per_node = min(layout.gpus_per_node, most_gpus) or layout.gpus_per_node
        raise JobSpecError(f"n_gpu={layout.n_gpu} needs {_plural(layout.nodes, 'node')} of {layout.gpus_per_node} "
                           f"GPUs but {where} has {_plural(count, 'node')}"
                           f"{' a job may use' if part.max_nodes is not None else ''}: "
                           f"ask for at most {count * per_node} GPUs")
    if layout.gpus_per_node > most_gpus:
        raise JobSpecError(f"{layout.gpus_per_node} GPUs per node asked but the nodes of {where} have at most "
                           f"{most_gpus} (Gres {max(part.nodes, key=lambda n: n.gpus).gres or 'none'}): ask for at "
                           f"most {most_gpus} GPUs per node (profile {profile.name!r} has gpus_per_node="
                           f"{profile.gpus_per_node})")
    if cpus > most_cpus:
        share = max(1, most_cpus // max(1, layout.tasks_per_node))
        raise JobSpecError(f"{layout.tasks_per_node} task(s) x {layout.cpus_per_task} CPUs = {cpus} CPUs per node but "
                           f"the nodes of {where} have at most {most_cpus}: give cpus_per_task={share} or fewer")
    limit = min(most_mem, part.max_mem_per_node_mb or most_mem)
    if mem is not None and mem > limit:
        raise JobSpecError(f"memory {mem} MB per node (profile {profile.name!r}: "
                           f"{'mem=' + str(profile.mem) if profile.mem else 'mem_per_cpu=' + str(profile.mem_per_cpu)}) "
                           f"but the nodes of {where} have at most {limit} MB: lower it")
    fitting = [n for n in part.nodes if n.gpus >= layout.gpus_per_node and n.cpus >= cpus
               and (mem is None or n.mem_mb >= mem)]
    if len(fitting) < layout.nodes:
        raise JobSpecError(f"only {_plural(len(fitting), 'node')} of {where} offer {layout.gpus_per_node} GPUs and "
                           f"{cpus} CPUs{f' and {mem} MB' if mem else ''} at once; the job needs {layout.nodes}")
