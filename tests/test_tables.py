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


def decimals_of(text: str) -> int | None:
    number = re.fullmatch(r"-?[\d ]+(?:\.(\d+))?", text.strip())
    return None if number is None else len(number.group(1) or "")


def assert_one_count_of_decimals_per_column(html: str) -> None:
    headers, rows, _ = read_back(html)
    for k, header in enumerate(headers):
        counts = {decimals_of(row[k].get_text()) for row in rows if row[k].get_text() != "–"}
        if None not in counts:
            assert len(counts) == 1, f"{header}: {counts} decimals in one column"


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
    ids_cells = [row[headers.index("run_id")] for row in rows]
    assert all(cell.find("span", style="white-space:nowrap") for cell in ids_cells)  # never broken over lines
    assert width_px(rendered(shown)[0]) < OUTPUT_PX  # Day 1's last table within the output


def test_a_comparison_reads_with_its_basis_and_the_long_basis_footnoted(runs):
    comparison = analysis.compare_runs({"small": ["1128-100000-aaaa"], "large": ["1128-100002-cccc"]},
                                       "throughput_compute", runs_dir=runs)
    html = comparison._repr_mimebundle_()["text/html"].split("<img")[0]
    assert_one_count_of_decimals_per_column(html)
    headers, rows, foot = read_back(html)
    ratio = [row[headers.index("ratio")].get_text() for row in rows]
    assert float(ratio[0]) == 1 and decimals_of(ratio[0]) == decimals_of(ratio[1])  # the baseline to the ratios' decimals
    assert "the median of each arm's settled steps" in foot and "95 % interval" in foot
    basis = rows[1][headers.index("basis")]
    assert basis.find("sup") is not None and len(basis.get_text()) < 32  # short in the cell ...
    assert comparison.table.loc[1, "basis"] in foot  # ... the whole of it in the footnote


def test_a_table_with_its_own_basis_and_rounded_columns(runs):
    speeds = analysis.batch_speeds(["1128-100000-aaaa", "1128-100001-bbbb", "1128-100002-cccc"], runs).round(2)
    html = html_of(speeds)
    assert_one_count_of_decimals_per_column(html)
    headers, rows, _ = read_back(html)
    low = [decimals_of(row[headers.index("low")].get_text()) for row in rows]
    value = [decimals_of(row[headers.index("throughput_compute")].get_text()) for row in rows]
    assert low == value  # a value and its interval to the same decimals
    assert all(d <= 2 for d in value)  # never more than the table was rounded to
