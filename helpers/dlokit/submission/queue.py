"""The live queue: which of my jobs are waiting or running, refreshed in place until they end.

In Jupyter it is an ipywidget (state, elapsed time, nodes, the last log line or why a job waits, a cancel button
per job) that fits the notebook's width; anywhere else it prints a text table when something changes. A watched job
that has ended stays in the table with its final state and last line. Works for both backends.
"""
from __future__ import annotations

import getpass
import html
import subprocess
import time

import pandas as pd
import psutil

from ..in_job import divergence
from . import devices, jobs
from .jobspec import format_seconds
from .profiles import current_profile

# reason: why a job waits, in a few words; reason_detail: the scheduler's or launcher's whole word on it
# expected: why, for a job that ended as it was meant to fail (a demonstration: jobs.Outcome.expected)
COLUMNS = ["job_id", "name", "state", "elapsed", "time_limit", "nodes", "node_list", "reason", "last_log_line",
           "reason_detail", "expected"]


def job_table(name: str | None = None, job_ids=None) -> pd.DataFrame:
    """My active jobs (optionally only those with this job name, or these ids) as a DataFrame. When the Slurm
    controller does not answer, the jobs that may still be active show as NO_ANSWER rows, the reason saying so."""
    wanted = None if job_ids is None else {str(i) for i in job_ids}
    rows = _slurm_rows(name, wanted) if current_profile().backend == "slurm" else _local_rows(name)
    if wanted is not None:
        rows = [row for row in rows if row["job_id"] in wanted]
    return pd.DataFrame(rows, columns=COLUMNS)


def _slurm_rows(name: str | None, wanted: set | None = None) -> list[dict]:
    # -r: one line per array element, so a pending element shows as 12_1 (with its reason), not as 12_[1]
    command = ["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%j|%T|%M|%l|%D|%R|%r"]
    if name:
        command += ["-n", name]
    cards = {card.job_id: card for card in jobs.of_this_cluster(jobs.all_cards(name))}
    silence = jobs.controller_silence()
    if silence:
        return _no_answer_rows(cards, wanted, silence)
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        return _no_answer_rows(cards, wanted, f"squeue: {jobs.said(error)}")
    if out.returncode:
        return _no_answer_rows(cards, wanted, f"squeue: {jobs.said(out)}")
    rows = []
    for line in out.stdout.splitlines():
        job_id, job_name, state, elapsed, limit, nodes, node_list, reason = line.split("|", 7)
        pending = state == "PENDING"
        card = cards.get(job_id)
        reason = reason if pending and reason != "None" else ""
        rows.append(dict(job_id=job_id, name=job_name, state=state,
                         elapsed=_waited(card) if pending and card else elapsed, time_limit=limit,
                         nodes=int(nodes), node_list="" if pending else node_list, reason=reason,
                         last_log_line=jobs.script_line(card) if card and not pending else "", reason_detail=reason))
    return rows


def _waited(card: jobs.JobCard) -> str:
    """How long a waiting job has waited: since its submission (the scheduler's clock starts only when it runs)."""
    return jobs.hms(time.time() - card.submitted_at)


RECENT_S = 24 * 3600  # with neither squeue nor sacct answering, a job submitted this recently may still be queued


def _no_answer_rows(cards: dict, wanted: set | None, why: str) -> list[dict]:
    """The controller is silent: a NO_ANSWER row for each job of these cards that may still be active (sacct,
    which slurmdbd answers, says so or does not know; asked about, or submitted lately), never an error: a watch
    goes on, and shows the jobs again once the controller is back."""
    chosen = [card for job_id, card in cards.items() if wanted is None or job_id in wanted]
    last = _sacct_states([card.job_id for card in chosen])
    rows = []
    for card in chosen:
        said = last.get(card.job_id)
        if said is not None and said not in jobs.ACTIVE:
            continue  # it ended, as accounting knows
        if said is None and wanted is None and time.time() - card.submitted_at > RECENT_S:
            continue
        reason = f"no answer: the Slurm controller did not answer ({why})" + (f"; sacct last said {said}" if said else "")
        rows.append(dict(job_id=card.job_id, name=card.name, state=jobs.NO_ANSWER, elapsed="",
                         time_limit=format_seconds(card.time_seconds), nodes=card.nodes, node_list="",
                         reason=reason, last_log_line=jobs.script_line(card), reason_detail=reason))
    return rows


def _sacct_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: its state in accounting} for those sacct knows; {} when it does not answer either."""
    if not job_ids or jobs.slurm_config_problem():
        return {}
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in out.stdout.splitlines():
        job_id, _, state = line.partition("|")
        if state.split():
            states[job_id] = state.split()[0]
    return states


def _local_rows(name: str | None) -> list[dict]:
    rows = []
    for card in jobs.all_cards(name):
        if not jobs.local_alive(card):
            continue
        outcome = jobs.job_outcome(card.job_id)
        pending = outcome.state == "PENDING"
        rows.append(dict(job_id=card.job_id, name=card.name, state=outcome.state,
                         elapsed=_waited(card) if pending else outcome.elapsed or "00:00:00",
                         time_limit=format_seconds(card.time_seconds), nodes=1,
                         node_list="" if pending else "localhost", reason=_local_reason(card) if pending else "",
                         last_log_line="" if pending else jobs.script_line(card),
                         reason_detail=outcome.cause if pending else ""))
    return rows


def _local_reason(card: jobs.JobCard) -> str:
    """What a waiting local job waits for and who holds it, in a few words (its launcher's note says it all)."""
    request = _launcher_request(card)
    if request is None:
        return "waits for its devices"
    need, among = request
    mine = {c.native_id: c for c in jobs.all_cards()}
    held_by = {device: _holder(note, mine, card.name) for device, note in devices.holders(among).items()}
    return devices.pending_reason(need, among, held_by)


def _launcher_request(card: jobs.JobCard) -> tuple[int, list[str]] | None:
    """(how many devices, among which) the job's launcher was started with; None once it has gone."""
    try:
        argv = psutil.Process(int(card.scheduler_id)).cmdline()
        return int(argv[argv.index("--need") + 1]), argv[argv.index("--among") + 1].split(",")
    except (psutil.Error, ValueError, IndexError):
        return None


def _holder(note: dict, mine: dict, waiting_name: str) -> str:
    """Who holds a device, as the waiting job's owner reads it: "your job 1128-…-d3b7", "bob's job bob", or, for a
    job of this user that another notebook (another logs folder) submitted, "your job alice from another notebook"."""
    if note.get("user") != getpass.getuser():
        return f"{note.get('user', 'another user')}'s job {note.get('name')}"
    card = mine.get(str(note.get("pid")))
    if card is None:
        return f"your job {note.get('name')} from another notebook (pid {note.get('pid')})"
    return f"your job {short_id(card.job_id)}" + (f" ({card.name})" if card.name != waiting_name else "")


def short_id(job_id: str) -> str:
    """A local job id without its time of day, 1128-143005-d3b7 -> 1128-…-d3b7; Slurm's ids as they are."""
    parts = job_id.split("-")
    return f"{parts[0]}-…-{parts[-1]}" if len(parts) > 2 else job_id


def distinct_ids(job_ids) -> dict[str, str]:
    """The part of each id that tells it from the others: 1128-143005-d3b7 -> …-d3b7 (the whole id if needed)."""
    job_ids = list(job_ids)
    found = {}
    for job_id in job_ids:
        parts = job_id.split("-")
        for k in range(1, len(parts) + 1):
            tail = parts[-k:]
            if sum(other.split("-")[-k:] == tail for other in job_ids) == 1 or k == len(parts):
                found[job_id] = ("…-" if k < len(parts) else "") + "-".join(tail)
                break
    return found


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "ZMQ" in type(shell).__name__


WATCH_MARGIN_S = 600  # default timeout: the longest time limit of the watched jobs plus this


def display_slurm_queue(name: str | None = None, timestep: float = 5.0, timeout_s: float | None = None,
                        job_ids=None) -> pd.DataFrame:
    """Show my jobs (those named `name`, or only `job_ids`), refresh every `timestep` s, return once none is left.

    Returns the last non-empty table seen, so a notebook can look at what ran. It stops watching after
    `timeout_s` (default: the longest time limit of these jobs plus 10 minutes; float("inf"): never) and
    says which jobs are still queued and why; the jobs themselves go on.
    """
    if timeout_s is None:
        timeout_s = default_watch_timeout(name, job_ids)
    if _in_jupyter():
        return _watch_widget(name, timestep, timeout_s, job_ids)
    return _watch_text(name, timestep, timeout_s, job_ids)


def default_watch_timeout(name: str | None = None, job_ids=None) -> float:
    """The longest time limit among these jobs' cards plus WATCH_MARGIN_S (an hour when none is known)."""
    cards = jobs.all_cards(name)
    if job_ids is not None:
        wanted = {str(i) for i in job_ids}
        cards = [card for card in cards if card.job_id in wanted]
    limits = [card.time_seconds for card in cards if isinstance(card.time_seconds, int)]
    return (max(limits) if limits else 3000) + WATCH_MARGIN_S


def timeout_message(table: pd.DataFrame, timeout_s: float) -> str:
    """What is still queued when the watch stops, with Slurm's reason for the PENDING jobs."""
    waiting = "; ".join(f"{row.job_id} {row.state}" + (f" ({row.reason})" if row.reason else "")
                        for row in table.itertuples())
    return (f"stopped watching after {timeout_s:.0f} s (display_slurm_queue's timeout_s): still in the queue: "
            f"{waiting}. The jobs go on: call display_slurm_queue again, or dlokit.job_outcome(job_id), "
            "or dlokit.cancel(job_id)")


LOCAL_POLL_S = 0.2  # on this machine, how often the watch looks whether its jobs have ended (a process check)


def _local_cards(job_ids) -> list:
    """The cards of the watched jobs when they all run on this machine (else []): their launcher processes
    can be checked often; on Slurm the watch waits for the next refresh, so squeue is not asked more often."""
    if job_ids is None or current_profile().backend != "local":
        return []
    try:
        return [jobs.find_card(str(i)) for i in job_ids]
    except LookupError:
        return []


def _pause(timestep: float, cards: list, on_tick=None) -> None:
    """Sleep until the next refresh, or less when every watched local job has ended in between: a cell that
    waits for a 10-second job should not wait 5 more for the refresh."""
    deadline = time.time() + timestep
    while time.time() < deadline:
        if on_tick is not None:
            on_tick()
        time.sleep(min(LOCAL_POLL_S, max(0.0, deadline - time.time())))
        if cards and not any(jobs.local_alive(card) for card in cards):
            return


class _Watched:
    """The jobs one watch shows: those asked for (or seen in the queue). Each that has left the queue is kept with
    its final state and last line, so that a job that ended between two refreshes still shows how it ended."""

    def __init__(self, job_ids=None):
        self.ids = [str(i) for i in job_ids or []]
        self.cards: dict = {}
        self.ended: dict[str, dict] = {}

    def card(self, job_id: str):
        if job_id not in self.cards:
            try:
                self.cards[job_id] = jobs.find_card(job_id)
            except LookupError:
                self.cards[job_id] = None
        return self.cards[job_id]

    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """The queue's rows, then those of the watched jobs that have ended."""
        queued = set(table["job_id"])
        self.ids += [i for i in table["job_id"] if i not in self.ids]
        for job_id in self.ids:
            if job_id not in queued and job_id not in self.ended and self.card(job_id) is not None:
                row = _ended_row(self.card(job_id))
                if row is not None:
                    self.ended[job_id] = row
        ended = pd.DataFrame([self.ended[i] for i in self.ids if i in self.ended and i not in queued], columns=COLUMNS)
        if ended.empty:
            return table
        return ended if table.empty else pd.concat([table, ended], ignore_index=True)

    def fresh(self, table: pd.DataFrame, since: float) -> pd.DataFrame:
        """The table `since` s after the scheduler was asked: each running job's last line read again (its log
        file) and the queued jobs' elapsed times moved on."""
        lines = [jobs.script_line(self.card(row.job_id)) if row.state == "RUNNING" and self.card(row.job_id)
                 else row.last_log_line for row in table.itertuples()]
        elapsed = [_later(row.elapsed, since) if row.state in ("PENDING", "RUNNING") else row.elapsed
                   for row in table.itertuples()]
        return table.assign(last_log_line=lines, elapsed=elapsed)


def _later(elapsed: str, seconds: float) -> str:
    """An HH:MM:SS time `seconds` later (Slurm's other forms, 1-02:03:04 or 3:04, as they are)."""
    parts = str(elapsed).split(":")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return elapsed
    hours, minutes, secs = map(int, parts)
    return jobs.hms(hours * 3600 + minutes * 60 + secs + seconds)


def _ended_row(card: jobs.JobCard) -> dict | None:
    """A job that has left the queue: its final state, elapsed time and last line; a failed job's error (where in the
    student's files) in place of its last line; None while it is not known to have ended (just submitted, or the
    scheduler does not answer)."""
    try:
        outcome = jobs.card_outcome(card)
    except (jobs.SchedulerError, OSError):
        return None
    if not outcome.finished:
        return None
    failure = "" if outcome.expected else outcome.error  # a failure by design reads "failed as expected" instead
    return dict(job_id=card.job_id, name=card.name, state=outcome.state, elapsed=outcome.elapsed,
                time_limit=format_seconds(card.time_seconds), nodes=card.nodes, node_list="", reason=failure,
                last_log_line=jobs.script_line(card) if card.log_path().exists() and not failure else "",
                reason_detail=outcome.cause if failure else "", expected=outcome.expected)


def _watch_text(name, timestep, timeout_s, job_ids=None) -> pd.DataFrame:
    start, last_text, last = time.time(), None, job_table(name, job_ids)
    cards, watched = _local_cards(job_ids), _Watched(job_ids)
    while True:
        table = job_table(name, job_ids)
        shown = _with_expected(watched.rows(table)).drop(columns=["elapsed", "reason_detail", "expected"])
        text = shown.to_string(index=False) if len(shown) else ""
        if table.empty:  # last: a reader of the output waits for this line
            text = ("how they ended:\n" + text + "\n" if text else "") + "no job left in the queue"
        if text != last_text:
            print(time.strftime("%H:%M:%S"), text, sep="\n", flush=True)
            last_text = text
        if table.empty:
            return last
        if timeout_s is not None and time.time() - start > timeout_s:
            print(timeout_message(table, timeout_s), flush=True)
            return table
        last = table
        _pause(timestep, cards)


STYLE = """<style>
table.dlokit-queue { border-collapse: collapse; font-family: monospace; font-size: 12px; width: 100%; }
table.dlokit-queue thead th, table.dlokit-queue tbody td { padding: 2px 8px; border-bottom: 1px solid #ddd;
  text-align: left; vertical-align: top; white-space: nowrap; }
table.dlokit-queue thead th { background: #f0f0f0; }
table.dlokit-queue tbody td:last-child, table.dlokit-queue thead th:last-child { white-space: normal;
  overflow-wrap: anywhere; width: 100%; }
.dlokit-queue span[title] { text-decoration: underline dotted; cursor: help; }
.dlokit-state-RUNNING, .dlokit-state-COMPLETED { color: #1a7f37; font-weight: bold; }
.dlokit-state-PENDING, .dlokit-state-CONFIGURING { color: #9a6700; font-weight: bold; }
.dlokit-state-NO_ANSWER { color: #cf222e; font-weight: bold; }
.dlokit-diverging { color: #cf222e; }
.dlokit-state-EXPECTED { color: #0969da; font-weight: bold; }
.dlokit-state-FAILED, .dlokit-state-TIMEOUT, .dlokit-state-OUT_OF_MEMORY, .dlokit-state-NODE_FAIL,
.dlokit-state-UNKNOWN { color: #cf222e; font-weight: bold; }
</style>"""
# a waiting job has a reason and no line yet, a running one a line: one column. The selectors name the table
# (table.dlokit-queue thead th): pandas' DataFrame outputs style every ".dataframe thead th" of the page
SAID = "last log line / reason"


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else html.escape(str(value))


def _said(row) -> str:
    """The reason (the whole of it on hover), or why a failure was expected, over the last log line."""
    reason, detail = _text(row.reason), _text(getattr(row, "reason_detail", ""))
    if reason and detail and detail != reason:
        reason = f'<span title="{detail}">{reason}</span>'
    if _text(getattr(row, "expected", "")):
        reason = f"failed as expected ({_text(row.expected)})"
    line = _text(row.last_log_line)
    if divergence.WORD in line:  # the script's own judgement of its step (dlokit.in_job.divergence), on its own line
        line, word, note = line.partition(divergence.WORD)
        line = f'{line.rstrip(" |")}<br><span class="dlokit-diverging">{word}{note}</span>'
    return "<br>".join(text for text in (reason, line) if text)


def _state_cell(row) -> str:
    """The state, coloured; a failure by design reads "OUT_OF_MEMORY as expected", in blue, not red."""
    if _text(getattr(row, "expected", "")):
        return f'<span class="dlokit-state-EXPECTED">{_text(row.state)} as expected</span>'
    return f'<span class="dlokit-state-{_text(row.state)}">{_text(row.state)}</span>'


def _with_expected(table: pd.DataFrame) -> pd.DataFrame:
    """The text watch's rows, a failure by design's state as "OUT_OF_MEMORY: failed as expected (why)"."""
    why = [w if isinstance(w, str) else "" for w in table["expected"]]
    return table.assign(state=[f"{s}: failed as expected ({w})" if w else s for s, w in zip(table["state"], why)])


def _table_html(table: pd.DataFrame, name: str | None) -> str:
    title = f"jobs named <b>{html.escape(name)}</b>" if name else "my jobs"
    if table.empty:
        return f"<p>{title}: none left in the queue ({time.strftime('%H:%M:%S')})</p>"
    queued = table["state"].isin(jobs.ACTIVE).any()
    heading = (f"{title} at {time.strftime('%H:%M:%S')} (refreshing)" if queued else
               f"{title}: none left in the queue ({time.strftime('%H:%M:%S')}); how they ended:")
    shown = pd.DataFrame({column: table[column].map(_text) for column in
                          ("job_id", "name", "elapsed", "time_limit", "node_list")})
    shown.insert(2, "state", [_state_cell(row) for row in table.itertuples()])
    shown[SAID] = [_said(row) for row in table.itertuples()]
    body = shown.to_html(index=False, escape=False, classes="dlokit-queue", border=0)
    return f"{STYLE}<p>{heading}</p>{body}"


LINE_REFRESH_S = 1.0  # between two refreshes of the queue, how often the running jobs' last lines are read again


def _watch_widget(name, timestep, timeout_s, job_ids=None) -> pd.DataFrame:
    import ipywidgets as widgets
    from IPython.display import display
    from jupyter_ui_poll import ui_events

    board = widgets.HTML()
    buttons = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
    box = widgets.VBox([board, buttons], layout=widgets.Layout(width="100%"))
    box.add_class("dlokit-queue-widget")
    display(box)
    cancelled: set[str] = set()

    def cancel_button(job_id, label):
        button = widgets.Button(description=f"cancel {label}", tooltip=f"cancel job {job_id}", button_style="danger",
                                icon="times", layout=widgets.Layout(width="auto"))

        def on_click(_):
            button.disabled = True
            cancelled.add(job_id)
            jobs.cancel(job_id)

        button.on_click(on_click)
        return button

    start, last = time.time(), job_table(name, job_ids)
    cards, watched = _local_cards(job_ids), _Watched(job_ids)
    shown_ids: list[str] = []
    with ui_events() as process_clicks:
        while True:
            table = job_table(name, job_ids)
            rows = watched.rows(table)
            board.value = _table_html(rows, name)
            ids = [i for i in table["job_id"] if i not in cancelled]
            if ids != shown_ids:
                labels = distinct_ids(ids)
                buttons.children = [cancel_button(i, labels[i]) for i in ids]
                shown_ids = ids
            if table.empty:
                buttons.children = []
                return last
            if timeout_s is not None and time.time() - start > timeout_s:
                # the cancel buttons stay: they still work once the cell has returned
                board.value += f"<p><b>{html.escape(timeout_message(table, timeout_s))}</b></p>"
                return table
            last = table
            _pause(timestep, cards, on_tick=_ticker(process_clicks, board, watched, rows, name))


def _ticker(process_clicks, board, watched: _Watched, rows: pd.DataFrame, name):
    """What the watch does while it waits for the next refresh: the cancel buttons' clicks, and every
    LINE_REFRESH_S the running jobs' last lines and the elapsed times (a job's progress is seen as it prints)."""
    asked = shown = time.time()

    def tick():
        nonlocal shown
        process_clicks(5)
        if time.time() - shown >= LINE_REFRESH_S:
            shown = time.time()
            board.value = _table_html(watched.fresh(rows, shown - asked), name)

    return tick
