"""run_picker: choose runs by job id, name or tag and compare them on a metric, in a notebook."""
from __future__ import annotations

import ipywidgets as widgets

from dlokit.analysis.compare import METRICS, compare_runs
from dlokit.analysis.run import list_run_ids, load_runs


def _brief(run) -> str:
    config = run.config
    parts = [run.info.get("script"), config.get("model"), config.get("batch_size") and f"bs {config['batch_size']}",
             run.world_size > 1 and f"{run.world_size} ranks"]
    return " ".join(str(p) for p in parts if p)


def _searchable(run) -> str:
    return " ".join([run.label, _brief(run), str(run.config.get("tag", ""))]).lower()


class RunPicker(widgets.VBox):
    """Filter box + multi-select of runs + metric and baseline drop-downs; the output refreshes."""

    def __init__(self, runs_dir=None, metric: str = "throughput_train"):
        self.runs_dir = runs_dir
        self.comparison = None
        self.filter = widgets.Text(placeholder="job id, name or tag", description="filter")
        self.runs = widgets.SelectMultiple(description="runs", rows=8, layout={"width": "28em"})
        self.metric = widgets.Dropdown(options=METRICS, value=metric, description="metric")
        self.baseline = widgets.Dropdown(options=[], description="baseline")
        self.refresh = widgets.Button(description="rescan", icon="refresh")
        self.output = widgets.Output()
        super().__init__([widgets.HBox([self.filter, self.refresh]), self.runs,
                          widgets.HBox([self.metric, self.baseline]), self.output])
        self._all = []
        self._updating = False
        self.filter.observe(lambda _: self._fill(), names="value")
        self.runs.observe(lambda _: self._baselines(), names="value")
        self.metric.observe(lambda _: self.show(), names="value")
        self.baseline.observe(lambda _: self._updating or self.show(), names="value")
        self.refresh.on_click(lambda _: self.rescan())
        self.rescan()

    def rescan(self) -> None:
        self._all = load_runs(list_run_ids(self.runs_dir), self.runs_dir)
        self._fill()

    def _fill(self) -> None:
        needle = self.filter.value.strip().lower()
        chosen = set(self.runs.value)
        options = [(f"{r.label} · {_brief(r)} · {r.state}", r.run_id) for r in reversed(self._all)
                   if needle in _searchable(r)]
        self.runs.options = options
        self.runs.value = tuple(v for _, v in options if v in chosen)

    def _baselines(self) -> None:
        current = self.baseline.value
        self._updating = True
        try:
            self.baseline.options = list(self.runs.value)
            if current in self.runs.value:
                self.baseline.value = current
        finally:
            self._updating = False
        self.show()

    def show(self) -> None:
        self.output.outputs = ()
        if not self.runs.value:
            self.comparison = None
            return
        selected = [r for r in self._all if r.run_id in self.runs.value]
        self.comparison = compare_runs(selected, self.metric.value, baseline=self.baseline.value)
        self.output.append_display_data(self.comparison)


def run_picker(runs_dir=None, metric: str = "throughput_train") -> RunPicker:
    """A widget over every run in runs_dir (default $DLOKIT_RUNS_DIR or ./runs)."""
    return RunPicker(runs_dir, metric)
