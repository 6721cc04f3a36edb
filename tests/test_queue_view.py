"""The queue widget: log lines as text, never as markup; a waiting job's reason in a few words (the whole of it on
hover); cancel buttons that tell the jobs apart; a job that ended between two refreshes shown with its last line."""
import html

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


def test_a_waiting_job_says_what_it_waits_for_in_the_submitted_unit_and_whose_job_holds_it():
    from dlokit.submission.devices import pending_reason

    mine = "your job 1128-…-d3b7"
    assert pending_reason(2, ["cpu0", "cpu1"], {"cpu0": mine, "cpu1": mine}) == f"waits for the CPU: {mine} holds it"
    assert pending_reason(1, ["cpu0", "cpu1"], {"cpu0": mine, "cpu1": "bob's job bob"}) == \
        f"waits for 1 core: {mine} holds cpu0; bob's job bob holds cpu1"  # alone=False: a core per task
    assert pending_reason(2, ["gpu0", "gpu1"], {"gpu1": mine}) == f"waits for 2 GPUs: {mine} holds gpu1"
    assert pending_reason(1, ["gpu0"], {}) == "waits for 1 GPU: earlier jobs go first"


def test_cancel_buttons_name_the_part_of_each_id_that_differs():
    from dlokit.submission.queue import distinct_ids, short_id

    ids = ["1128-120501-d3b7", "1128-120502-a1c2", "1128-120503-a1c2", "4211_3"]
    assert distinct_ids(ids) == {"1128-120501-d3b7": "…-d3b7", "1128-120502-a1c2": "…-120502-a1c2",
                                 "1128-120503-a1c2": "…-120503-a1c2", "4211_3": "4211_3"}
    assert short_id("1128-120501-d3b7") == "1128-…-d3b7" and short_id("4211") == "4211"


def test_the_short_reason_shows_and_the_whole_one_is_on_hover():
    whole = ("waiting for 2 free device(s) among cpu0, cpu1: in use by cpu0 (alice's job alice, pid 16290), "
             "cpu1 (alice's job alice, pid 16290)")
    rows = [dict(job_id="1128-120501-d3b7", name="alice", state="RUNNING", elapsed="00:00:07", time_limit="00:10:00",
                 nodes=1, node_list="localhost", reason="", last_log_line="step 3/20 loss 2.1", reason_detail=""),
            dict(job_id="1128-120502-a1c2", name="alice", state="PENDING", elapsed="00:00:05", time_limit="00:10:00",
                 nodes=1, node_list="", reason="waits for the CPU: your job 1128-…-d3b7 holds it", last_log_line="",
                 reason_detail=whole)]
    page = _table_html(pd.DataFrame(rows, columns=COLUMNS), "alice")
    assert f'<span title="{html.escape(whole)}">waits for the CPU: your job 1128-…-d3b7 holds it</span>' in page
    assert "<td>step 3/20 loss 2.1</td>" in page and "(refreshing)" in page
    ended = dict(rows[0], state="COMPLETED", node_list="", last_log_line="step 20/20 loss 0.4")
    page = _table_html(pd.DataFrame([ended], columns=COLUMNS), "alice")
    assert "none left in the queue" in page and "how they ended" in page and "step 20/20 loss 0.4" in page


PROGRESS = """import sys, time
steps, pause = int(sys.argv[1]), float(sys.argv[2])
for step in range(1, steps + 1):
    print(f"step {step}/{steps} loss {2.3 / step:.3f}", flush=True)
    time.sleep(pause)
"""


def test_a_pending_job_names_the_job_it_waits_for_and_its_wait_grows(workspace):
    import time

    import dlokit
    from dlokit.submission import queue

    dlokit.use_profile("local")
    (workspace / "progress.py").write_text(PROGRESS)
    [running] = dlokit.gpu_jobs_submitter(f"{workspace / 'progress.py'} 40 0.5", n_gpu=1, name="stud7",
                                          time_max="00:02:00", verbose=False)
    [waiting] = dlokit.gpu_jobs_submitter(f"{workspace / 'progress.py'} 1 0", n_gpu=1, name="stud7",
                                          time_max="00:02:00", verbose=False)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            rows = {row["job_id"]: row for row in queue.job_table("stud7").to_dict("records")}
            if rows.get(running, {}).get("last_log_line", "").startswith("step") and "holds" in rows[waiting]["reason"]:
                break
            time.sleep(0.2)
        unit = "1 GPU" if queue.devices.machine_devices()[0].startswith("gpu") else "the CPU"
        row = rows[waiting]
        assert row["state"] == "PENDING" and row["last_log_line"] == "", row
        assert row["reason"].startswith(f"waits for {unit}") and f"your job {queue.short_id(running)}" in row["reason"]
        assert "root's" not in row["reason"] and "free device(s)" in row["reason_detail"], row
        time.sleep(2.1)
        later = queue.job_table("stud7", [waiting]).iloc[0]
        assert later["state"] == "PENDING" and later["elapsed"] > row["elapsed"] >= "00:00:00", (row, later)
    finally:
        dlokit.cancel(running)
        dlokit.cancel(waiting)
        dlokit.wait([running, waiting], timeout_s=60)


def test_a_job_that_ends_between_two_refreshes_still_shows_its_last_line(workspace, capsys):
    import dlokit
    from dlokit.submission import queue

    dlokit.use_profile("local")
    (workspace / "progress.py").write_text(PROGRESS)
    ids = dlokit.gpu_jobs_submitter(f"{workspace / 'progress.py'} 3 0", n_gpu=1, name="quick", time_max="00:02:00",
                                    verbose=False)
    dlokit.wait(ids, timeout_s=60)  # it ended before the watch's first look
    queue.display_slurm_queue("quick", timestep=0.2, job_ids=ids)
    printed = capsys.readouterr().out
    assert "how they ended" in printed and "COMPLETED" in printed and "step 3/3 loss 0.767" in printed, printed
    assert printed.rstrip().endswith("no job left in the queue"), printed


def test_a_device_held_by_another_notebooks_job_says_so():
    import getpass

    from dlokit.submission import queue

    note = {"user": getpass.getuser(), "name": "alice", "pid": 4242}
    assert queue._holder(note, {}, "alice") == "your job alice from another notebook (pid 4242)"
    assert queue._holder({**note, "user": "bob"}, {}, "alice") == "bob's job alice"
