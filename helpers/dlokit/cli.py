"""`dlokit` on the command line: the notebook helpers for a terminal.

    dlokit profiles
    dlokit preview --profile jean-zay --account abc@a100 --n-gpu 16 train_classifier.py --test
    dlokit submit --n-gpu 2 --name alice train_classifier.py --test
    dlokit queue --name alice
    dlokit outcome 1234
    dlokit doctor --profile local-slurm        # before class: every path the course takes, checked on the site
    dlokit plan --config 1b --n-gpu 64 --profile jean-zay --preview --account abc@a100   # which layout, on paper
"""
from __future__ import annotations

import argparse
import sys

from . import plan_cli
from .submission import jobs, profiles
from .submission.jobspec import JobSpec, JobSpecError, plan, sbatch_preview
from .submission.queue import display_slurm_queue
from .submission.submit import submit


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile name (default: $DLOKIT_PROFILE or 'local')")
    parser.add_argument("--account", help="Slurm account, for profiles that need one")
    parser.add_argument("--n-gpu", type=int, default=1)
    parser.add_argument("--name", default="dlokit", help="job name (letters, digits, '.', '_', '-')")
    parser.add_argument("--time", default="00:10:00", help="time limit HH:MM:SS")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="script.py and its arguments")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlokit", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("profiles", help="list the profiles and where they send jobs")
    _job_arguments(sub.add_parser("preview", help="print the batch script a job would get (submits nothing)"))
    _job_arguments(sub.add_parser("submit", help="submit a job"))
    queue = sub.add_parser("queue", help="watch my jobs until they end")
    queue.add_argument("--name")
    outcome = sub.add_parser("outcome", help="how a job ended, with the cause of a failure")
    outcome.add_argument("job_id")
    doctor = sub.add_parser("doctor", help="submit tiny jobs through a profile and say what works there")
    doctor.add_argument("--profile", help="profile name (default: $DLOKIT_PROFILE or 'local')")
    doctor.add_argument("--account", help="Slurm account, for profiles that need one")
    doctor.add_argument("--gpus", type=int, default=2, help="tasks of the multi-task checks (default 2)")
    doctor.add_argument("--data", default="", help="the data set folder the notebooks will read (DATA); "
                        "default: check that the generated one can be written")
    plan_parser = sub.add_parser("plan", help="rank every layout of a model on a cluster's GPUs, on paper")
    plan_cli.add_arguments(plan_parser)
    args = parser.parse_args(argv)

    if args.verb == "plan":
        return plan_cli.run(args)
    if args.verb == "doctor":
        from .doctor import run

        if args.gpus < 2:
            parser.error("--gpus must be at least 2: the check is that tasks reach each other")
        return run(args.profile, gpus=args.gpus, account=args.account, data=args.data)
    try:
        if args.verb == "profiles":
            for name, table in sorted(profiles.load_profiles().items()):
                print(f"{name:12s} {table.get('description', '')}")
            return 0
        profile = profiles.use_profile(getattr(args, "profile", None), account=getattr(args, "account", None))
        if args.verb in ("preview", "submit"):
            spec = JobSpec.from_command(args.command, name=args.name, n_gpu=args.n_gpu, time_max=args.time)
            if args.verb == "preview":
                print(f"# {plan(spec, profile).summary(spec.name)}")
                print(sbatch_preview(spec, profile))
            else:
                submit(spec, profile)
        elif args.verb == "queue":
            display_slurm_queue(args.name)
        elif args.verb == "outcome":
            print(jobs.job_outcome(args.job_id))
    except (JobSpecError, profiles.ProfileError, LookupError) as err:
        print(f"dlokit: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
