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


def test_architecture_names_every_helper_module_once_and_every_path_it_names_exists():
    import re

    page = (REPO / "docs" / "architecture.md").read_text()
    table = page.split("## The helpers, by who uses them", 1)[1]
    named = re.findall(r"`([\w/]+(?:\.py|/))`", table.split("\n\n", 2)[2].split("\n\n")[0])
    package = REPO / "helpers" / "dlokit"
    present = [p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
               if p.suffix == ".py" or (p / "__init__.py").is_file()]
    for listed in ("in_job", "submission"):  # their modules are listed one by one
        present += [p.name for p in (package / listed).glob("*.py") if p.name != "__init__.py"]
    assert sorted(named) == sorted(present), "docs/architecture.md's table of helpers is out of step"
    for path in re.findall(r"`((?:helpers|tp_scripts|docs|tests|scripts)/[\w/.-]+)`", page):
        assert (REPO / path).exists(), f"docs/architecture.md names {path}, which does not exist"


def test_architecture_names_every_training_script_module_once():
    """The table lists each folder's files in three columns: the students' (those of solutions/), the ones a TP
    runs, and those of its shared package (common/, llm_kit/); `ls` of the folder shows nothing else but that
    package, llm/ and solutions/."""
    import re

    page = (REPO / "docs" / "architecture.md").read_text()
    table = page.split("## The training scripts' files", 1)[1].split("\n## ", 1)[0]
    rows = {row.split("|")[1].strip(" `").split("`")[0]: row.split("|")[2:5] for row in table.splitlines()
            if row.startswith("| `tp_scripts/")}
    for folder, package in (("tp_scripts/", "common"), ("tp_scripts/llm/", "llm_kit")):
        students, tools, shared = (sorted(re.findall(r"`(\w+\.py)`", column)) for column in rows[folder])
        assert students == sorted(p.name for p in (REPO / folder / "solutions").glob("*.py")), \
            f"docs/architecture.md's students' files of {folder} are not those of {folder}solutions/"
        assert sorted(students + tools) == sorted(p.name for p in (REPO / folder).glob("*.py")), \
            f"docs/architecture.md's row for {folder} is out of step with the files in it"
        assert shared == sorted(p.name for p in (REPO / folder / package).glob("*.py") if p.name != "__init__.py"), \
            f"docs/architecture.md's row for {folder} is out of step with {folder}{package}/"
        folders = sorted(p.name for p in (REPO / folder).iterdir() if p.is_dir() and not p.name.startswith("__"))
        assert folders == sorted([package, "solutions", *(["llm"] if folder == "tp_scripts/" else [])])


def test_instructors_page_says_what_every_doctor_check_proves():
    from dlokit.doctor.report import CHECKS

    page = (REPO / "docs" / "instructors.md").read_text()
    for check, proves in CHECKS.items():
        assert f"| {check} | {proves} |" in page, check
