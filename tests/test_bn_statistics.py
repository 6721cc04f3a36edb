"""TP2.3 on any device: bn_statistics.py on 2 gloo ranks. The solution's synchronised statistics are the whole
batch's and its check passes; the untouched student copy keeps each rank's own, and the same check fails."""
import os
import sys
from pathlib import Path

import preloaded
import pytest

import dlokit
from dlokit import analysis, checks
from dlokit.checks.day2 import bn_statistics
from ranks import run_ranks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def run(tmp_path, script: Path, run_id: str, nproc: int = 2):
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "DLOKIT_RUNS_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script), "--channels", "3", "--batch", "4", "--size", "5"]
    if nproc > 1:
        result = run_ranks(command, nproc, env, timeout=120)
    else:
        result = preloaded.run(command, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_id


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """The checks read the current profile's runs folder: the local profile's, pointed here."""
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    dlokit.use_profile("local")  # an earlier test of this worker may have chosen another profile
    return tmp_path


def test_the_solution_normalises_every_rank_with_the_global_batchs_statistics(runs):
    job = run(runs, REPO / "tp_scripts" / "solutions" / "bn_statistics.py", "bn-solution")
    table = analysis.bn_statistics_table(job, runs)
    assert list(table["rank"]) == [0, 0, 0, 1, 1, 1]
    assert (table["synced_mean"] - table["whole_mean"]).abs().max() < 1e-5
    assert (table["synced_var"] - table["whole_var"]).abs().max() < 1e-5
    assert (table["own_mean"] - table["whole_mean"]).abs().min() > 0.1  # rank r's share is brighter by r
    assert bn_statistics(job).status == "passed"
    assert len(analysis.bn_statistics_plot(job, runs).axes[0].patches) == 3 * 3  # 2 ranks' own + synced, 3 channels


def test_the_untouched_student_copy_fails_its_check(runs):
    script = REPO / "tp_scripts" / "bn_statistics.py"
    assert "TODO TP2.3" in script.read_text() and "all_reduce" not in script.read_text()
    result = bn_statistics(run(runs, script, "bn-student"))
    assert result.status == "failed" and "TODO TP2.3" in result.message


def test_one_process_has_nothing_to_synchronise(runs):
    result = bn_statistics(run(runs, REPO / "tp_scripts" / "solutions" / "bn_statistics.py", "bn-one", nproc=1))
    assert result.status == checks.NOT_APPLICABLE and "nothing to synchronise" in result.message, result
