"""The queue widget's table shows log lines as text, never as markup."""
import pandas as pd

from dlokit.submission.queue import COLUMNS, _table_html


def test_log_lines_are_escaped_and_states_coloured():
    row = dict(job_id="7", name="alice", state="RUNNING", elapsed="00:00:03", time_limit="00:10:00", nodes=1,
               node_list="localhost", last_log_line="<script>alert(1)</script> loss 2.3")
    page = _table_html(pd.DataFrame([row], columns=COLUMNS), "alice")
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; loss 2.3" in page
    assert '<span class="dlokit-state-RUNNING">RUNNING</span>' in page


def test_a_job_the_controller_does_not_answer_about_is_a_row_that_says_so():
    row = dict(job_id="7", name="alice", state="NO_ANSWER", elapsed="", time_limit="00:10:00", nodes=1,
               node_list="", reason="no answer: the Slurm controller did not answer (scontrol ping: ... is DOWN)",
               last_log_line="step 3")
    page = _table_html(pd.DataFrame([row], columns=COLUMNS), "alice")
    assert '<span class="dlokit-state-NO_ANSWER">NO_ANSWER</span>' in page and ".dlokit-state-NO_ANSWER {" in page
    assert "no answer: the Slurm controller did not answer" in page


def test_empty_queue_says_so():
    assert "none left in the queue" in _table_html(pd.DataFrame(columns=COLUMNS), "alice")


def test_the_last_log_line_is_the_script_s_own(workspace):
    """submitit's plumbing ("The following command is sent: ... RLIMIT_DATA ...") never fills the queue's row: before
    the script prints, the row says "starting", then it shows the script's own last line."""
    import time
    from pathlib import Path

    import dlokit
    from dlokit.submission import jobs, queue

    dlokit.use_profile("local", mem="2G")  # a memory limit: submitit logs the long RLIMIT command line
    sleeper = Path(__file__).parent / "job_scripts" / "sleep.py"
    [job_id] = dlokit.gpu_jobs_submitter(f"{sleeper} 30", n_gpu=1, name="lastline", time_max="00:01:00")
    card = jobs.find_card(job_id)
    deadline = time.time() + 60
    while "sleeping" not in jobs.tail(card.log_path(), 40) and time.time() < deadline:
        assert queue.job_table("lastline")["last_log_line"].isin(["", "starting", "sleeping"]).all()
        time.sleep(0.1)
    assert "The following command is sent" in card.log_path().read_text()  # the plumbing is there...
    assert queue.job_table("lastline")["last_log_line"].tolist() == ["sleeping"]  # ...and not shown
    dlokit.cancel(job_id)
    dlokit.wait(job_id, timeout_s=60)
