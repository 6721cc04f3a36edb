"""The queue widget's table shows log lines as text, never as markup."""
import pandas as pd

from dlokit.queue import COLUMNS, _table_html


def test_log_lines_are_escaped_and_states_coloured():
    row = dict(job_id="7", name="alice", state="RUNNING", elapsed="00:00:03", time_limit="00:10:00", nodes=1,
               node_list="localhost", last_log_line="<script>alert(1)</script> loss 2.3")
    page = _table_html(pd.DataFrame([row], columns=COLUMNS), "alice")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; loss 2.3" in page
    assert '<span class="dlokit-state-RUNNING">RUNNING</span>' in page


def test_empty_queue_says_so():
    assert "none left in the queue" in _table_html(pd.DataFrame(columns=COLUMNS), "alice")
