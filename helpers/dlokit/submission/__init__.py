"""Sending jobs and watching them: the day's commands (day), the checks and the submission through submitit
(submit, jobspec, profiles), the job cards and outcomes (jobs), the live queue (queue), and on this machine the
device locks and the launcher that waits for them (devices, device_launcher, tree_memory)."""
