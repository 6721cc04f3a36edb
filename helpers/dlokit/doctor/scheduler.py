"""The doctor's checks on the login node: the profile, and what the kit asks the scheduler (scontrol, sacctmgr,
sacct). Each returns Findings; none submits a job."""
from __future__ import annotations

import subprocess

from ..submission import profiles
from ..submission.jobspec import ClusterQueryError, cluster_limits, user_accounts
from .report import failed, not_checked, passed

LOCAL = "the local backend has no scheduler"


def load_profile(name: str | None, account: str | None):
    """(profile or None, finding)."""
    try:
        profile = profiles.use_profile(name, account=account)
    except profiles.ProfileError as err:
        return None, failed("profile", str(err), "edit the profile (dlokit profiles lists them; ~/.config/dlokit/"
                                                 "profiles.toml or ./dlokit_profiles.toml hold yours)")
    where = ", ".join(f"{key} {getattr(profile, key)}" for key in ("partition", "account", "qos", "constraint")
                      if getattr(profile, key))
    return profile, passed("profile", f"{profile.name} ({profile.backend}{': ' + where if where else ''}), logs in "
                                      f"{profile.logs}, runs in {profile.runs}")


def cluster(profile) -> list:
    if profile.backend != "slurm":
        return [not_checked("cluster limits", LOCAL), not_checked("accounts", LOCAL)]
    return [_limits(profile), _accounts(profile)]


def _limits(profile):
    try:
        partitions = cluster_limits(profile)
    except ClusterQueryError as err:
        return failed("cluster limits", f"the cluster could not be asked: {_one_line(err)}",
                      "run the doctor on the cluster's login node, where scontrol reaches the controller")
    name = profile.partition or next((p.name for p in partitions.values() if p.default), "")
    if name not in partitions:
        return failed("cluster limits", f"partition {name or '(default)'!r} is not one of this cluster's: "
                                        f"{', '.join(sorted(partitions))}",
                      "set partition in the profile to one of them")
    part = partitions[name]
    gpus = sorted({node.gpus for node in part.nodes})
    summary = (f"partition {name}: {len(part.nodes)} node(s) with {'/'.join(map(str, gpus)) or 0} GPU(s) each, "
               f"max time {'unlimited' if part.max_time_s is None else f'{part.max_time_s // 60} min'}")
    if gpus and str(profile.gpus_per_node) != "auto" and int(profile.gpus_per_node) > max(gpus):
        return failed("cluster limits", f"{summary}, but the profile says gpus_per_node = {profile.gpus_per_node}",
                      f"set gpus_per_node = {max(gpus)} in the profile")
    return passed("cluster limits", summary)


def _one_line(err, limit: int = 300) -> str:
    return " ".join(str(err).split())[:limit]


def nodes_in_partition(profile) -> int:
    try:
        partitions = cluster_limits(profile)
    except ClusterQueryError:
        return 0
    name = profile.partition or next((p.name for p in partitions.values() if p.default), "")
    return len(partitions[name].nodes) if name in partitions else 0


def _accounts(profile):
    try:
        accounts = user_accounts(profile)
    except ClusterQueryError as err:
        return not_checked("accounts", f"sacctmgr does not answer ({_one_line(err)}); jobs are submitted without checking")
    if profile.account and profile.account not in accounts:
        return failed("accounts", f"account {profile.account!r} is not one of yours: {', '.join(accounts) or 'none'}",
                      f"set account in the profile to one of {', '.join(accounts)}" if accounts else
                      "ask the site for an account, then set it in the profile")
    return passed("accounts", f"yours: {', '.join(accounts) or 'none listed'}"
                              + (f"; the profile charges {profile.account}" if profile.account else ""))


def accounting(profile, job_id: str):
    """sacct answers about a job that has ended (what the kit reads when the queue no longer shows it)."""
    if profile.backend != "slurm":
        return not_checked("accounting", LOCAL)
    try:
        done = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job_id, "--format=JobID,State"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return failed("accounting", f"sacct did not answer: {err}", "ask the site whether accounting is enabled")
    rows = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode or not rows:
        return failed("accounting", f"sacct knows nothing of job {job_id} "
                                    f"({(done.stderr or 'no row').strip()[:200]})",
                      "without accounting a job that left the queue reads as UNKNOWN: ask the site for slurmdbd")
    return passed("accounting", f"sacct: job {rows[0].replace('|', ' ')}")
