"""A student on the course's JupyterHub, in a real browser: the hub (scripts/jupyterhub/) on the local
Slurm, a Unix test user logs in through headless Chromium, the server starts as a Slurm job of that user,
Day 1 opens, its first submit cell runs, the job shows in the queue widget, and it runs as a job of its
own (the notebook server's job does not leak into it). Stopping the server cancels its job.

Needs root (Unix users, PAM, runuser) and the hub's environment (scripts/jupyterhub/setup.sh; the test
runs it, which installs it the first time). The screenshot is kept in output/test-artifacts/.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from conftest import free_ports, searchable_by_all
from jupyter_page import ARTIFACTS, new_page, run_cells, wait_for_one_kernel

REPO = Path(__file__).resolve().parents[1]
HUB_SCRIPTS = REPO / "scripts" / "jupyterhub"
USER = "dlokithub1"
NICKNAME = "hubtest"
TINY = {"NICKNAME": NICKNAME, "PROFILE": "local-slurm", "MODEL": "mobilenet_v3_small", "IMAGE_SIZE": 32,
        "BATCH_SIZE": 8, "STEPS": 4, "TRAIN_PER_CLASS": 8, "REFRESH_S": 1}

pytestmark = [pytest.mark.slurm, pytest.mark.browser]


def run(command, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=kwargs.pop("timeout", 600), **kwargs)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done


def user_jobs(state: str = "") -> list[tuple[str, str]]:
    """(job id, job name) of the test user's jobs in the queue."""
    out = subprocess.run(["squeue", "-h", "-u", USER, "-o", "%i %j", *(["-t", state] if state else [])],
                         capture_output=True, text=True, timeout=30).stdout
    return [tuple(line.split(" ", 1)) for line in out.splitlines() if line.strip()]


def submitted_jobs(since: str) -> list[str]:
    """The ids of the jobs the notebook submitted (named after its NICKNAME) since then, running or done."""
    out = run(["sacct", "-X", "-n", "-P", "-u", USER, "--name", NICKNAME, "-S", since, "-o", "JobID"]).stdout
    return out.split()


def accounting(job_id: str) -> dict:
    out = run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,JobName,User,State"]).stdout
    job, name, user, state = out.splitlines()[0].split("|")
    return {"job": job, "name": name, "user": user, "state": state.split()[0]}


def accounted(job_id: str, past: tuple[str, ...]) -> dict | None:
    """The job's accounting record once its state is none of `past` (None before)."""
    record = accounting(job_id)
    return None if record["state"] in past else record


def job_logs(home: Path) -> str:
    return "\n".join(f"--- {path}\n{path.read_text()[-3000:]}"
                     for path in sorted((home / "notebooks" / "dlokit_jobs").rglob("*_log.*")))


def wait_until(predicate, timeout_s: float, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what() if callable(what) else what}")


def with_parameters(notebook: Path, parameters: dict) -> tuple[int, int, int]:
    """Add a cell after the parameters cell, as papermill does (the student would edit the cell); returns
    the index of the parameters cell, the index just after the first submit cell, and the cell count."""
    nb = nbformat.read(notebook, as_version=4)
    where = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    source = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    nb.cells.insert(where + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))
    nbformat.write(nb, notebook)
    submit = next(i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and "day.submit(" in cell.source)
    return where, submit + 1, len(nb.cells)


@pytest.fixture
def hub(slurm_cluster, tmp_path):
    """The hub on free ports, with one test student whose home (in a temp dir) has the course's files."""
    if os.geteuid() != 0:
        pytest.skip("the hub needs root: Unix users, PAM, jobs submitted as the student")
    homes = Path(tempfile.mkdtemp(prefix="dlokit-hub-homes-"))
    homes.chmod(0o755)
    password = secrets.token_urlsafe(12)
    port, api_port, proxy_port = free_ports(3)
    env = {**os.environ, "DLOKIT_HUB_DIR": str(tmp_path / "hub"), "DLOKIT_HUB_CLASS_DIR": str(homes / "class"),
           "DLOKIT_HUB_PORT": str(port),
           "DLOKIT_HUB_API_PORT": str(api_port), "DLOKIT_HUB_PROXY_API_PORT": str(proxy_port)}
    if subprocess.run(["id", USER], capture_output=True).returncode == 0:  # left by an interrupted run
        run(["usermod", "--home", str(homes / USER), USER])
    from dlokit.submission.day import synthetic_data

    synthetic_data(TINY["TRAIN_PER_CLASS"], TINY["IMAGE_SIZE"])  # the tiny data set, made as the instructor
    with searchable_by_all(slurm_cluster, REPO):
        try:
            run(["bash", str(HUB_SCRIPTS / "setup.sh"), "--users", USER, "--home-base", str(homes),
                 "--slurm-account", "dlokit"],
                env={**env, "DLOKIT_HUB_PASSWORD": password})
            home = homes / USER
            notebook = home / "notebooks" / "day1_single_gpu.ipynb"
            cells = with_parameters(notebook, TINY)
            shutil.chown(notebook, USER)
            run(["bash", str(HUB_SCRIPTS / "start.sh")], env=env, timeout=120)
            yield {"url": f"http://127.0.0.1:{port}", "password": password, "home": home, "cells": cells,
                   "runs": homes / "class" / "runs"}
        finally:
            subprocess.run(["bash", str(HUB_SCRIPTS / "stop.sh"), "--servers"], env=env, capture_output=True,
                           timeout=120)
            subprocess.run(["scancel", "-u", USER], capture_output=True, timeout=30)
            with contextlib.suppress(Exception):
                wait_until(lambda: not user_jobs(), 30, "the test user's jobs to end")
            subprocess.run(["userdel", USER], capture_output=True, timeout=30)
            shutil.rmtree(homes, ignore_errors=True)


def test_student_runs_day1_submit_cell_from_jupyterhub_on_slurm(hub):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        page = new_page(playwright)
        try:
            student_session(page, hub)
        finally:
            page.screenshot(path=str(ARTIFACTS / "jupyterhub-last.png"), full_page=False)  # where it ended
            page.context.browser.close()


def student_session(page, hub):
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    page.goto(f"{hub['url']}/hub/login")
    page.fill("#username_input", USER)
    page.fill("#password_input", hub["password"])
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{USER}/lab**", timeout=120_000)  # spawn-pending until the job serves

    [(server_job, _)] = user_jobs("RUNNING")
    # until slurmdbd has the job's record, sacct shows a placeholder ("allocation", user root, PENDING)
    server = wait_until(lambda: accounted(server_job, past=("PENDING",)), 30, "the server job in Slurm's accounting")
    assert server["user"] == USER, f"the server must be a job of the student: {server}"

    page.goto(f"{hub['url']}/user/{USER}/lab/tree/notebooks/day1_single_gpu.ipynb?reset")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    wait_for_one_kernel(page, f"{hub['url']}/user/{USER}/api/kernels")
    run_cells(page, *hub["cells"])

    page.wait_for_selector(".dlokit-queue-widget table.dlokit-queue", timeout=240_000)
    # read the live queue now: once the job has ended (it may, while sacct catches up) the widget says "none left"
    live_queue = page.inner_text(".dlokit-queue-widget")
    page.screenshot(path=str(ARTIFACTS / "jupyterhub-day1-queue.png"), full_page=False)
    [job_id] = wait_until(lambda: submitted_jobs(since), 30, "the job in Slurm's accounting")
    assert job_id in live_queue, f"the live queue did not list job {job_id}:\n{live_queue}"
    page.wait_for_function(
        "() => document.querySelector('.dlokit-queue-widget').innerText.includes('none left')", timeout=120_000)

    # the job ran on its own: its record carries its own id, not the notebook server's; it is in the class's
    # folder, group-writable (the server's umask), where the leaderboard and the class report read it
    records = next(hub["runs"].glob(f"{job_id}@*"), hub["runs"] / job_id) / "rank0"  # <id>@<cluster>
    assert (records / "summary.json").is_file(), f"no run record; the job's logs:\n{job_logs(hub['home'])}"
    record = json.loads((records / "run.json").read_text())
    summary = json.loads((records / "summary.json").read_text())
    assert job_id != server_job
    assert record["run_id"] == records.parent.name and record["run_id"].split("@")[0] == job_id and record["world_size"] == 1, record
    assert summary["status"] == "completed", summary
    # the queue reads the job's end from the run; slurmdbd's record of it can lag a few seconds behind
    ended = wait_until(lambda: accounted(job_id, past=("PENDING", "RUNNING")), 30, "the job's end in Slurm's accounting")
    assert ended == {"job": job_id, "name": NICKNAME, "user": USER, "state": "COMPLETED"}
    assert (records / "summary.json").stat().st_mode & 0o020, "the class folder's files are group-writable"

    page.goto(f"{hub['url']}/hub/home")
    page.wait_for_selector("#stop", state="visible", timeout=30_000)
    page.click("#stop")
    # the hub hides the button once its API has stopped the server (batchspawner: scancel, then the job's end)
    page.wait_for_selector("#stop", state="hidden", timeout=120_000)
    wait_until(lambda: not user_jobs(), 120, lambda: f"the server's job to end (queue now: {user_jobs()})")
    stopped = wait_until(lambda: accounted(server_job, past=("PENDING", "RUNNING")), 30, "the server job's end")
    assert stopped["state"] == "CANCELLED", stopped
