"""The live queue: which of my jobs are waiting or running, refreshed in place until they end.

In Jupyter it is an ipywidget (state, elapsed time, nodes, last log line, a cancel button per job);
anywhere else it prints a text table when something changes. Works for both backends.
"""
from __future__ import annotations

import getpass
import html
import subprocess
import time

import pandas as pd

from . import jobs
from .jobspec import format_seconds
from .profiles import current_profile

COLUMNS = ["job_id", "name", "state", "elapsed", "time_limit", "nodes", "node_list", "reason", "last_log_line"]


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
        rows.append(dict(job_id=job_id, name=job_name, state=state, elapsed=elapsed, time_limit=limit,
                         nodes=int(nodes), node_list="" if pending else node_list,
                         reason=reason if pending and reason != "None" else "",
                         last_log_line=jobs.script_line(card) if card else ""))
    return rows


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
        rows.append(dict(job_id=card.job_id, name=card.name, state=jobs.NO_ANSWER, elapsed="",
                         time_limit=format_seconds(card.time_seconds), nodes=card.nodes, node_list="",
                         reason=f"no answer: the Slurm controller did not answer ({why})"
                                + (f"; sacct last said {said}" if said else ""),
                         last_log_line=jobs.script_line(card)))
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
        rows.append(dict(job_id=card.job_id, name=card.name, state=outcome.state, elapsed=outcome.elapsed or "0:00",
                         time_limit=format_seconds(card.time_seconds), nodes=1,
                         node_list="" if pending else "localhost", reason=outcome.cause if pending else "",
                         last_log_line="" if pending else jobs.script_line(card)))
    return rows


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


def _watch_text(name, timestep, timeout_s, job_ids=None) -> pd.DataFrame:
    start, last_text, last = time.time(), None, job_table(name, job_ids)
    cards = _local_cards(job_ids)
    while True:
        table = job_table(name, job_ids)
        text = table.drop(columns=["elapsed"]).to_string(index=False) if len(table) else "no job left in the queue"
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
.dlokit-queue { border-collapse: collapse; font-family: monospace; font-size: 12px; }
.dlokit-queue th, .dlokit-queue td { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: left; }
.dlokit-queue th { background: #f0f0f0; }
.dlokit-queue td { white-space: nowrap; }
.dlokit-queue td:last-child { white-space: normal; max-width: 60ch; overflow-wrap: anywhere; }
.dlokit-state-RUNNING { color: #1a7f37; font-weight: bold; }
.dlokit-state-PENDING, .dlokit-state-CONFIGURING { color: #9a6700; font-weight: bold; }
.dlokit-state-NO_ANSWER { color: #cf222e; font-weight: bold; }
</style>"""


def _table_html(table: pd.DataFrame, name: str | None) -> str:
    title = f"jobs named <b>{html.escape(name)}</b>" if name else "my jobs"
    if table.empty:
        return f"<p>{title}: none left in the queue ({time.strftime('%H:%M:%S')})</p>"
    shown = table.assign(state=[f'<span class="dlokit-state-{html.escape(s)}">{html.escape(s)}</span>'
                                for s in table["state"]])
    for column in shown.columns.drop("state"):
        shown[column] = shown[column].map(lambda value: html.escape(str(value)))
    body = shown.to_html(index=False, escape=False, classes="dlokit-queue", border=0)
    return f"{STYLE}<p>{title} at {time.strftime('%H:%M:%S')} (refreshing)</p>{body}"


def _watch_widget(name, timestep, timeout_s, job_ids=None) -> pd.DataFrame:
    import ipywidgets as widgets
    from IPython.display import display
    from jupyter_ui_poll import ui_events

    board = widgets.HTML()
    buttons = widgets.HBox()
    box = widgets.VBox([board, buttons])
    box.add_class("dlokit-queue-widget")
    display(box)
    cancelled: set[str] = set()

    def cancel_button(job_id):
        button = widgets.Button(description=f"cancel {job_id}", button_style="danger", icon="times")

        def on_click(_):
            button.disabled = True
            cancelled.add(job_id)
            jobs.cancel(job_id)

        button.on_click(on_click)
        return button

    start, last = time.time(), job_table(name, job_ids)
    cards = _local_cards(job_ids)
    shown_ids: list[str] = []
    with ui_events() as process_clicks:
        while True:
            table = job_table(name, job_ids)
            board.value = _table_html(table, name)
            ids = [i for i in table["job_id"] if i not in cancelled]
            if ids != shown_ids:
                buttons.children = [cancel_button(i) for i in ids]
                shown_ids = ids
            if table.empty:
                buttons.children = []
                return last
            if timeout_s is not None and time.time() - start > timeout_s:
                # the cancel buttons stay: they still work once the cell has returned
                board.value += f"<p><b>{html.escape(timeout_message(table, timeout_s))}</b></p>"
                return table
            last = table
            _pause(timestep, cards, on_tick=lambda: process_clicks(5))
