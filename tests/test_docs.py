"""Pages generated from code stay in step with the code."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_sbatch_examples_page_is_current():
    sys.path.insert(0, str(REPO / "scripts"))
    import make_sbatch_examples

    assert (REPO / "docs" / "sbatch-examples.md").read_text() == make_sbatch_examples.render(), \
        "run: python scripts/make_sbatch_examples.py"


def test_cli_preview_refuses_bad_input_with_exit_code_2():
    result = subprocess.run([sys.executable, "-m", "dlokit.cli", "preview", "--profile", "local-slurm",
                             "--n-gpu", "6", "x.py"], capture_output=True, text=True)
    assert result.returncode == 2 and "6 GPUs do not fill whole nodes" in result.stderr
