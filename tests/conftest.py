"""Shared fixtures: an isolated kit workspace per test and the project's real local Slurm cluster."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SLURM_SCRIPTS = REPO / "scripts" / "local_slurm"
PYTHON = sys.executable


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A fresh folder as the notebook's working directory, with its own log and runs folders."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLOKIT_LOG_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("DLOKIT_LOCK_DIR", str(tmp_path / "locks"))  # device locks of this test only
    monkeypatch.delenv("DLOKIT_PROFILE", raising=False)
    from dlokit.submission import profiles

    monkeypatch.setattr(profiles, "_current", None)  # the default profile, whatever an earlier test chose
    return tmp_path


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _cluster_env(state_dir: Path) -> dict:
    """The variables env.sh exports (SLURM_CONF, ...), read by sourcing it in bash."""
    out = subprocess.run(["bash", "-c", f"source {shlex.quote(str(state_dir / 'env.sh'))} && env -0"],
                         capture_output=True, check=True).stdout.decode()
    exported = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    return {k: v for k, v in exported.items() if os.environ.get(k) != v}


def _free_ports_for(nodes: int) -> dict:
    """Free ports for a cluster: slurmctld, slurmdbd, MariaDB, and one slurmd port per node (consecutive)."""
    while True:
        ctld, dbd, db, slurmd = free_ports(4)
        following = list(range(slurmd + 1, slurmd + nodes))
        if set(following).isdisjoint({ctld, dbd, db}) and all(_bindable(port) for port in following):
            return {"DLOKIT_SLURMCTLD_PORT": str(ctld), "DLOKIT_SLURMD_PORT": str(slurmd),
                    "DLOKIT_SLURMDBD_PORT": str(dbd), "DLOKIT_MARIADB_PORT": str(db)}


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _first_job_id(nodes: int) -> int:
    """Clusters started by different workers number their jobs apart (a job's rendezvous port comes from its id)."""
    worker = int(re.sub(r"\D", "", os.environ.get("PYTEST_XDIST_WORKER", "")) or 0)
    return 1 + 3000 * (2 * worker + (nodes > 1))


def _start_cluster(state_dir: Path, nodes: int = 1) -> dict:
    """scripts/local_slurm/start.sh on free ports (a cluster already running is left alone); its env.sh variables."""
    if os.environ.get("DLOKIT_SKIP_SLURM"):
        pytest.skip("DLOKIT_SKIP_SLURM is set")
    for attempt in (1, 2):  # once, a 2-node start stopped at a step that passed the moment before (suite run 18)
        started = subprocess.run(["bash", str(SLURM_SCRIPTS / "start.sh"), "--nodes", str(nodes), str(state_dir)],
                                 capture_output=True, text=True, timeout=300,
                                 env={**os.environ, **_free_ports_for(nodes),
                                      "DLOKIT_SLURM_FIRST_JOB_ID": str(_first_job_id(nodes))})
        if not started.returncode:
            break
        warnings.warn(f"local Slurm did not start (attempt {attempt}):\n{started.stdout}\n{started.stderr}")
    else:
        raise RuntimeError(f"local Slurm did not start twice:\n{started.stdout}\n{started.stderr}")
    return _cluster_env(state_dir)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """Start the real single-node Slurm (slurmctld, slurmd, slurmdbd + MariaDB, 4 fake GPUs) once."""
    state_dir = Path(os.environ.get("DLOKIT_TEST_SLURM_DIR") or tmp_path_factory.mktemp("slurm"))
    env = _start_cluster(state_dir)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield state_dir
    subprocess.run(["bash", str(SLURM_SCRIPTS / "stop.sh"), str(state_dir)], capture_output=True, timeout=120)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def _two_node_cluster(tmp_path_factory):
    """The real two-node Slurm (start.sh --nodes 2: node1, node2, 4 fake GPUs each), started once, beside the
    one-node cluster (its own ports and state dir); (state dir, its env.sh variables)."""
    state_dir = tmp_path_factory.mktemp("slurm2n")
    env = _start_cluster(state_dir, nodes=2)
    yield state_dir, env
    subprocess.run(["bash", str(SLURM_SCRIPTS / "stop.sh"), str(state_dir)], capture_output=True, timeout=120)


@pytest.fixture
def slurm_cluster_2n(_two_node_cluster, monkeypatch):
    """The two-node cluster, for this test: SLURM_CONF points at it (and back at the one-node cluster after)."""
    state_dir, env = _two_node_cluster
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return state_dir


@pytest.fixture(params=["local", "local-slurm"])
def backend(request, workspace):
    """Run a test once on the embedded default and once on the real local Slurm."""
    import dlokit

    if request.param == "local-slurm":
        request.getfixturevalue("slurm_cluster")
    return dlokit.use_profile(request.param)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test.sh runs two workers), the tests of the two-node cluster go to one
    worker, which starts that cluster once. The one-node cluster is a session fixture: each worker that
    runs a test needing it starts its own (a few seconds), so those tests spread over both workers."""
    for item in items:
        if "slurm_cluster_2n" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("slurm-2n"))
        elif getattr(item.module, "__name__", "") in SHARED_LAUNCHES and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=_longest_first)


def _longest_first(item) -> int:
    """The longest first (the local notebooks, the two-node cluster's tests, then the `slow` ones), so that short
    tests fill the end, not a long one. xdist's loadgroup hands out its groups by test count first (loadscopereorder),
    then single tests in this order."""
    group = item.get_closest_marker("xdist_group")
    name = (group.args or [group.kwargs.get("name")])[0] if group else None
    if name in LONGEST_GROUPS:
        return LONGEST_GROUPS.index(name)
    return len(LONGEST_GROUPS) + (0 if item.get_closest_marker("slow") else 1)


LONGEST_GROUPS = ["local-notebooks", "slurm-2n"]


# Modules whose tests share launches through a module fixture (the same runs, or test_compile's kernel cache, read
# by several tests) or a process's caches (test_gpu_plan_week: the activations classifier_memory measures and the jobs
# classifier_plan parses: the first plan takes a minute or more, the next ones in that process a second or less): one
# worker runs all of a module's tests, so that each launch happens once, not once per worker.
SHARED_LAUNCHES = {"test_day4_parallel", "test_day4_memory", "test_day4_pipeline", "test_day4_compress",
                   "test_day4_tp_cp", "test_checks", "test_compile", "test_gpu_plan_week"}


OPENED = Path("/tmp/dlokit-tests-searchable.json")  # what every test process opened, and how many still need it


@contextlib.contextmanager
def searchable_by_all(*paths: Path):
    """The students' servers read the cluster's slurm.conf, reach its munge socket and run the hub's venv
    in the repository: make the folders above them (pytest's are 0700; a checkout may sit in one too)
    searchable by everyone (o+x) while the test runs, then restore them. Kept open by a thread: any
    pytest session starting on this machine sets its base folder back to 0700. Shared by the xdist workers:
    the last one to leave restores the modes the first one found (else one worker closed what another's
    students were still using)."""
    from filelock import FileLock

    lock = FileLock(f"{OPENED}.lock")
    with lock:
        state = json.loads(OPENED.read_text()) if OPENED.exists() else {"users": 0, "modes": {}}
        for folder in {folder for path in paths for folder in [path, *path.parents]}:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                state["modes"].setdefault(str(folder), stat.S_IMODE(mode))
        state["users"] += 1
        OPENED.write_text(json.dumps(state))
    modes = {Path(folder): mode for folder, mode in state["modes"].items()}
    stop = threading.Event()

    def keep_open():
        while True:
            for folder, mode in modes.items():
                with contextlib.suppress(OSError):
                    folder.chmod(mode | stat.S_IXOTH)
            if stop.wait(0.2):
                return

    keeper = threading.Thread(target=keep_open, daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()
        with lock:
            state = json.loads(OPENED.read_text())
            state["users"] -= 1
            if state["users"] > 0:
                OPENED.write_text(json.dumps(state))
            else:
                OPENED.unlink()
                for folder, mode in state["modes"].items():
                    with contextlib.suppress(OSError):
                        Path(folder).chmod(mode)
