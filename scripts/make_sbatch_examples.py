"""Write docs/sbatch-examples.md: the batch scripts the kit generates for 1, 4 and 16 GPUs on the
Jean Zay-like profile. tests/test_docs.py fails when the page is out of date."""
from pathlib import Path

import dlokit

DOC = Path(__file__).resolve().parents[1] / "docs" / "sbatch-examples.md"
COMMAND = "train_classifier.py --batch-size 256 --amp bf16 --channels-last --epochs 10"
FOLDER = "/gpfswork/rech/abc/alice/dlokit_jobs/alice/alice"


def render() -> str:
    profile = dlokit.get_profile("jean-zay", account="abc@a100")
    parts = ["# Batch scripts the kit generates (Jean Zay-like profile)\n",
             "Made by `python scripts/make_sbatch_examples.py` from `dlokit.sbatch_preview`, the same code path",
             "as a real submission (submitit renders the script). Each task runs the training script through",
             "submitit's `CommandFunction`: the arguments travel pickled as a list, never through a shell.\n"]
    for n_gpu in (1, 4, 16):
        spec = dlokit.JobSpec.from_command(COMMAND, name="alice", n_gpu=n_gpu, time_max="01:00:00")
        parts += [f"## {n_gpu} GPU{'s' * (n_gpu > 1)}\n", f"`{dlokit.plan(spec, profile).summary('alice')}`\n",
                  "```bash", dlokit.sbatch_preview(spec, profile, folder=FOLDER).rstrip(), "```\n"]
    return "\n".join(parts)


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}")
