"""Every table a notebook shows reads the same way (analysis.table.html_of): one count of decimals per number
column, a footnote saying what each number is, ids on one line, long texts footnoted, no empty column, within the
968 px of a JupyterLab output. Rendered from real run records, read back as a browser would get them."""
from __future__ import annotations

import re

import pytest
from bs4 import BeautifulSoup

from dlokit import analysis
from dlokit.analysis.table import OUTPUT_PX, html_of, rendered, width_px
from test_analysis import write_scan_run

DAY1_FINAL = ["run_id", "state", "batch_size", "amp", "channels_last", "throughput_train", "throughput_compute",
              "t_data", "t_step", "gpu_mem_peak_mb", "host_rss_peak_mb", "overlapped_by"]  # Day 1's last cell


def read_back(html: str) -> tuple[list[str], list[list], str]:
    """(headers, rows of cells (bs4 tags), footnote text) of a rendered table."""
    soup = BeautifulSoup(html, "html.parser")
    headers = [th.get_text() for th in soup.select("thead th")]
    rows = [tr.find_all("td") for tr in soup.select("tbody tr")]
    return headers, rows, soup.select_one(".dlokit-basis").get_text(" ")


NUMBER = r"-?\d[\d\u202f]*(?:\.(\d+))?"  # 12 345.6: thousands apart by a narrow no-break space


def decimals_of(text: str) -> int | None:
    """A number's decimals; None: not a number."""
    number = re.fullmatch(NUMBER, text.strip())
    return None if number is None else len(number.group(1) or "")


def numbers_of(text: str) -> list[int] | None:
    """The decimals of a cell's numbers: one ("148.1"), or a value and its interval ("1.52 [1.34–1.71]")."""
    one = decimals_of(text)
    if one is not None:
        return [one]
    three = re.fullmatch(rf"({NUMBER}) \[({NUMBER})–({NUMBER})\]", text.strip())
    return None if three is None else [decimals_of(three.group(k)) for k in (1, 3, 5)]


def cell(rows, headers, header: str) -> list[str]:
    return [row[headers.index(header)].get_text() for row in rows]


def assert_one_count_of_decimals_per_column(html: str) -> None:
    headers, rows, _ = read_back(html)
    for k, header in enumerate(headers):
        found = [numbers_of(row[k].get_text()) for row in rows if row[k].get_text() != "–"]
        if found and None not in found:
            counts = {d for numbers in found for d in numbers}
            assert len(counts) == 1, f"{header}: {counts} decimals in one column (a value and its interval alike)"


@pytest.fixture
def runs(tmp_path):
    """Runs whose speeds differ by a factor 20, some steps much faster than others: where six decimals stood
    beside one."""
    for run_id, batch, speed in (("1128-100000-aaaa", 4, 12.3456789), ("1128-100001-bbbb", 16, 135.77),
                                 ("1128-100002-cccc", 64, 248.1)):
        write_scan_run(tmp_path, run_id, batch, speed, spread=0.05, seed=batch)
    return tmp_path


def test_the_runs_table_reads_with_one_count_of_decimals_and_what_each_number_is(runs):
    ids = ["1128-100000-aaaa", "1128-100001-bbbb", "1128-100002-cccc"]
    shown = analysis.runs_table(ids, runs)[DAY1_FINAL]
    html = html_of(shown)
    assert_one_count_of_decimals_per_column(html)
    headers, rows, foot = read_back(html)
    assert "throughput_train" in headers and "t_step" in headers
    assert "median of the run's settled steps" in foot and "seconds per step" in foot
    # nothing to show (no GPU, nothing overlapped): left out, and said so
    assert "gpu_mem_peak_mb" not in headers and "gpu_mem_peak_mb" in foot.split("left out, nothing in them here:")[1]
    assert "state" not in headers and "state: completed in every row" in foot  # one value: said once
    ids_cells = [row[headers.index("run_id")] for row in rows]
    assert all(cell.find("span", style="white-space:nowrap") for cell in ids_cells)  # never broken over lines
    overlapped = [row[headers.index("overlapped_by")] for row in rows]  # a list of ids: each on one line
    assert all(len(cell.find_all("span", style="white-space:nowrap")) == 2 for cell in overlapped)
    assert width_px(rendered(shown).cells) < OUTPUT_PX  # Day 1's last table within the output


def test_a_comparison_reads_with_its_basis_and_the_long_basis_footnoted(runs):
    comparison = analysis.compare_runs({"small": ["1128-100000-aaaa"], "large": ["1128-100002-cccc"]},
                                       "throughput_compute", runs_dir=runs)
    html = comparison._repr_mimebundle_()["text/html"].split("<img")[0]
    assert_one_count_of_decimals_per_column(html)
    headers, rows, foot = read_back(html)
    ratio = cell(rows, headers, "ratio [low–high]")
    assert numbers_of(ratio[0]) == numbers_of(ratio[1])[:1]  # the baseline's 1, alone, to the ratios' decimals
    assert float(ratio[0]) == 1 and "[" in ratio[1]
    assert all(re.fullmatch(rf"{NUMBER} \[{NUMBER}–{NUMBER}\]", v) for v in cell(rows, headers, "throughput_compute [low–high]"))
    assert "the median of each arm's settled steps" in foot and "95 % interval" in foot
    basis = rows[1][headers.index("basis")]
    assert basis.find("sup") is not None and len(basis.get_text()) < 32  # short in the cell ...
    assert comparison.table.loc[1, "basis"] in foot  # ... the whole of it in the footnote


def test_a_table_with_its_own_basis_and_rounded_columns(runs):
    speeds = analysis.batch_speeds(["1128-100000-aaaa", "1128-100001-bbbb", "1128-100002-cccc"], runs).round(2)
    html = html_of(speeds)
    assert_one_count_of_decimals_per_column(html)
    headers, rows, _ = read_back(html)
    shown = [numbers_of(v) for v in cell(rows, headers, "throughput_compute [low–high]")]
    assert all(len(set(numbers)) == 1 for numbers in shown)  # a value and its interval to the same decimals
    assert all(numbers[0] <= 2 for numbers in shown)  # never more than the table was rounded to


def test_the_scaling_table_fits_the_output_with_its_intervals_beside_their_values(tmp_path):
    """Day 2's scaling table: 17 columns, three of them intervals, ~1,200 px as columns of their own."""
    from test_analysis import write_run

    for world_size, t_step in ((1, 0.05), (2, 0.055), (4, 0.0625)):
        write_run(tmp_path, f"1128-10000{world_size}-abcd", world_size=world_size, t_data=0.0, t_step=t_step, steps=5)
    table = analysis.scaling_table(None, tmp_path).round(3)  # as verdicts.scaling_views shows it
    html = html_of(table)
    assert_one_count_of_decimals_per_column(html)
    headers, rows, foot = read_back(html)
    assert {"speedup [low–high]", "efficiency [low–high]"} <= set(headers) and "speedup_low" not in headers
    assert "the median of the settled steps of each world size's runs" in foot
    assert width_px(rendered(table).cells) < OUTPUT_PX


def test_a_record_s_lines_read_without_its_bookkeeping_and_without_python_s_repr(tmp_path):
    """TP4.4's check lines as the notebook shows them: no kind or time column, {'allreduce': 1} as 'allreduce 1'."""
    from dlokit.in_job.runrecord import RunRecorder

    with RunRecorder({"job": "check_tp"}, run_id="1128-100000-cafe", runs_dir=tmp_path) as recorder:
        for version, diff in (("scratch", 1.79e-7), ("dtensor", 1.6e-7)):
            recorder.log("tp_check", version=version, max_abs_diff_output=diff,
                         forward_collectives={"allgather": 1, "reduce_scatter": 1}, ok=True)
        recorder.finish()
    lines = analysis.load_run("1128-100000-cafe", tmp_path).lines("tp_check")
    assert {"kind", "time"} <= set(lines.columns)  # still there for the code that reads them
    headers, rows, foot = read_back(html_of(lines.drop(columns=["rank"], errors="ignore")))
    assert "kind" not in headers and "time" not in headers
    assert cell(rows, headers, "forward_collectives") == ["allgather 1, reduce_scatter 1"] * 2
    assert cell(rows, headers, "max_abs_diff_output") == ["1.79e-07", "1.60e-07"]
    assert "the tp_check lines of run 1128-100000-cafe" in foot


def test_sizes_read_whole_and_a_tiny_value_and_its_interval_alike():
    """TP4.9's bandwidth table: bytes from 4 KiB to 4 MiB as whole numbers, times of 0.2 ms and their intervals all
    in one notation (it read '2.00e-04 [2.00e-04–0.0003]')."""
    import pandas as pd

    table = pd.DataFrame({"op": ["all_reduce"] * 2, "bytes": [4096, 4194304], "time_s": [2.0e-4, 9.1e-3],
                          "time_low": [1.9e-4, 8.8e-3], "time_high": [2.6e-4, 9.9e-3]})
    headers, rows, _ = read_back(html_of(table))
    assert cell(rows, headers, "bytes") == ["4\u202f096", "4\u202f194\u202f304"]
    assert cell(rows, headers, "time_s [low–high]") == ["2.00e-04 [1.90e-04–2.60e-04]", "9.10e-03 [8.80e-03–9.90e-03]"]


def test_an_arm_without_a_ratio_reads_a_dash_and_the_baseline_its_one_alone():
    import pandas as pd

    shown = pd.DataFrame({"arm": ["fp32", "bf16", "fp16"], "ratio": ["1.00", "", "1.31"],
                          "ratio_low": ["1.00", "", "1.12"], "ratio_high": ["1.00", "", "1.52"]})
    headers, rows, _ = read_back(html_of(shown))  # as Comparison.shown gives them: text, "" where no ratio
    assert cell(rows, headers, "ratio [low–high]") == ["1.00", "–", "1.31 [1.12–1.52]"]


def test_a_value_and_its_interval_to_the_decimals_the_interval_supports():
    """TP3.3's compile table read '2.922 [2.241–3.812]': an interval ±0.8 wide supports two decimals, not three."""
    import pandas as pd

    table = pd.DataFrame({"variant": ["eager", "compile-default"], "speedup": [1.0, 2.9216],
                          "speedup_low": [0.765, 2.2405], "speedup_high": [1.3074, 3.8117]})
    headers, rows, _ = read_back(html_of(table))
    assert cell(rows, headers, "speedup [low–high]") == ["1.00 [0.77–1.31]", "2.92 [2.24–3.81]"]


def test_tp4_4_s_table_fits_the_output_and_says_each_direction_against_what_tp_expects(tmp_path, monkeypatch):
    """check_tp.py's eleven columns were ~1,100 px: the view puts each direction's collectives and what tensor
    parallelism expects in one cell, and a version that ran other collectives says what was expected."""
    from dlokit.in_job.runrecord import RunRecorder

    pair = {"allgather": 1, "reduce_scatter": 1}
    with RunRecorder({"job": "check_tp"}, run_id="1128-100000-beef", runs_dir=tmp_path) as recorder:
        for version, forward in (("scratch", {"allreduce": 1}), ("sequence_parallel", pair)):
            recorder.log("tp_check", version=version, max_abs_diff_output=1.79e-7, matches=True,
                         forward_collectives=forward, backward_collectives={"allreduce": 2},
                         forward_bytes={"allgather": 4096, "reduce_scatter": 8192}, backward_bytes={"allreduce": 8192},
                         expected_forward=pair if version == "sequence_parallel" else {"allreduce": 1},
                         expected_backward={"allreduce": 1}, counts_as_expected=False, ok=False)
        recorder.finish()
    monkeypatch.setenv("DLOKIT_RUNS_DIR", str(tmp_path))
    table = analysis.tp_check_table("1128-100000-beef")
    headers, rows, foot = read_back(html_of(table))
    assert cell(rows, headers, "forward") == ["allreduce 1 (as expected)",
                                              "allgather 1, reduce_scatter 1 (as expected)"]
    assert cell(rows, headers, "backward") == ["allreduce 2 (expected allreduce 1)"] * 2
    assert width_px(rendered(table).cells) < OUTPUT_PX, width_px(rendered(table).cells)
    assert "run 1128-100000-beef" in foot


def test_day3_s_trial_table_fits_the_output_with_short_labels_and_long_outcomes_footnoted():
    """TP3.5's trials, as dlokit.hpo.trials_table shows them: twelve columns were ~1,080 px in JupyterLab (962 px by
    width_px, the narrowest layout, which a browser exceeds); short headers, said in the footnote, and a pruned
    trial's outcome by its first clause bring it well within the output."""
    import datetime

    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import TrialState, create_trial

    from dlokit import hpo

    study = optuna.create_study(direction="maximize", study_name="alice-day3")
    study.set_user_attr("metric", "val_acc")
    space = {"lr": FloatDistribution(0.01, 1.0, log=True), "weight_decay": FloatDistribution(1e-6, 1e-3, log=True),
             "batch_size": CategoricalDistribution([16, 32, 64]), "label_smoothing": FloatDistribution(0.0, 0.2)}
    start = datetime.datetime(2026, 11, 28, 10, 0, 0)
    for k, (state, value, drawn_by) in enumerate([(TrialState.COMPLETE, 0.3125, "random start-up"),
                                                   (TrialState.COMPLETE, 0.28125, "random start-up"),
                                                   (TrialState.PRUNED, None, "TPE model"),
                                                   (TrialState.COMPLETE, 0.340625, "TPE model")]):
        job = f"1128-10000{k}-ab{k}d"
        outcome = (f"job {job} COMPLETED" if state == TrialState.COMPLETE else
                   f"pruned after epoch 1 (val_acc 0.1500); job {job} cancelled")
        trial = create_trial(state=state, value=value, distributions=space,
                             params={"lr": 0.0316 * (k + 1), "weight_decay": 2.1e-5 * (k + 1),
                                     "batch_size": [16, 32, 64][k % 3], "label_smoothing": 0.0123 * (k + 1)},
                             intermediate_values={0: 0.2, 1: 0.25} if value else {0: 0.15},
                             user_attrs={"drawn_by": drawn_by, "job_id": job, "outcome": outcome})
        trial.datetime_start, trial.datetime_complete = start, start + datetime.timedelta(seconds=30 + k)
        study.add_trial(trial)
    table = hpo.trials_table(study)
    assert table["outcome"].tolist() == ["", "", "pruned after epoch 1 (val_acc 0.1500); job 1128-100002-ab2d cancelled",
                                         ""]  # what a completed trial's state says already is not said twice
    assert width_px(rendered(table).cells) < 0.85 * OUTPUT_PX, width_px(rendered(table).cells)
    headers, rows, foot = read_back(html_of(table))
    assert headers == ["trial", "state", "val_acc", "lr", "wd", "batch", "ls", "ep", "drawn_by", "job_id", "time_s",
                       "outcome"]
    assert "labels: batch = batch_size, wd = weight_decay, ls = label_smoothing, ep = epochs, time_s = duration_s" in foot
    assert cell(rows, headers, "outcome") == ["", "", "pruned after epoch 11", ""]  # 1: its footnote
    assert "1  pruned after epoch 1 (val_acc 0.1500); job 1128-100002-ab2d cancelled" in foot
    ids = [row[headers.index("job_id")] for row in rows]
    assert all(c.find("span", style="white-space:nowrap") for c in ids)  # never broken over lines
    assert_one_count_of_decimals_per_column(html_of(table))
