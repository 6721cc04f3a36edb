"""The headless course runner executes notebooks with parameters and keeps their plots as PNG files."""
import json

import nbformat

from dlokit import course


def test_runner_injects_parameters_and_extracts_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # as a shell might have it: the runner must still get images
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("POINTS = 3", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
                                  "ax.plot(range(POINTS))\nprint('points', POINTS)"),
    ]
    source = tmp_path / "day9_demo.ipynb"
    nbformat.write(notebook, source)
    assert course.main([str(source), "--out", str(tmp_path / "out"), "-p", "POINTS", "5"]) == 0
    executed = nbformat.read(tmp_path / "out" / "day9_demo.ipynb", as_version=4)
    assert "points 5" in "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert [p.name for p in (tmp_path / "out" / "plots").iterdir()] == ["day9_demo_01.png"]
    # the machine's speed before and after, beside the notebooks' time: course times compare through it
    speed = json.loads((tmp_path / "out" / "yardstick.json").read_text())
    assert speed["notebooks_s"] > 0 and all(speed[when]["median_ms"] > 0 for when in ("before", "after"))


def test_a_failing_notebook_is_reported_and_the_run_fails(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("raise RuntimeError('broken cell')")]
    nbformat.write(notebook, tmp_path / "day9_broken.ipynb")
    assert course.main([str(tmp_path / "day9_broken.ipynb"), "--out", str(tmp_path / "out")]) == 1
    assert (tmp_path / "out" / "day9_broken.ipynb").exists()
