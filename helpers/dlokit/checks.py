"""Check cells: did the student's script really do what the TP asks? Answered from the run records.

    import dlokit.checks as checks
    checks.amp(baseline_id, [bf16_id])          # shows ✅ or ❌ with a sentence saying why

Every check reads what the training script *observed* while it ran (run.json "observed" block,
summary.json, profiler traces), not the options it was given: an option the script ignores is caught.
A check never raises: a missing, failed or still running job gives ❌ and says what to do.
Each result is shown (HTML in Jupyter, text elsewhere) and also carried under the MIME type
`application/vnd.dlokit.check+json`, which the notebook tests read; `scoreboard()` lists them all.
"""
from __future__ import annotations

import functools
import gzip
import html
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dlokit.analysis.table import as_number

MIME = "application/vnd.dlokit.check+json"
AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
PHASE_LABELS = ("data", "forward", "backward", "optimizer")
TYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "int": 4, "long int": 8,
              "long": 8, "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2}

RESULTS: list["CheckResult"] = []  # every check shown in this session, for scoreboard()


@dataclass
class CheckResult:
    check: str
    passed: bool
    message: str
    details: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def mark(self) -> str:
        return "✅" if self.passed else "❌"

    def __str__(self) -> str:
        lines = [f"{self.mark} {self.check}: {self.message}"] + [f"   • {d}" for d in self.details]
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None):
        colour = "#1a7f37" if self.passed else "#cf222e"
        items = "".join(f"<li>{html.escape(d)}</li>" for d in self.details)
        body = (f'<div style="border-left:4px solid {colour};padding:4px 10px;margin:4px 0">'
                f"<b>{self.mark} {html.escape(self.check)}</b>: {html.escape(self.message)}"
                f"{'<ul style=margin:2px>' + items + '</ul>' if items else ''}</div>")
        return {"text/plain": str(self), "text/html": body, MIME: _jsonable(asdict(self))}


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def show(result: CheckResult) -> CheckResult:
    """Display a result once (rich in Jupyter, text in a terminal) and remember it."""
    RESULTS.append(result)
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(result)
            return result
    except ImportError:
        pass
    print(result)
    return result


def _check(name: str):
    """Decorator: show the result; turn any unexpected error into a ❌ that says so."""

    def wrap(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            try:
                result = function(*args, **kwargs)
            except Exception as error:  # a check cell must never stop the notebook
                result = CheckResult(name, False, f"the check itself could not run ({type(error).__name__}: "
                                     f"{error}); look at the job's log with dlokit.search_log()")
            return show(result)

        run.check_name = name
        return run

    return wrap


# ---- reading runs -------------------------------------------------------------------------------

def _ids(job_ids) -> list[str]:
    if job_ids is None:
        return []
    if isinstance(job_ids, (str, int)) or hasattr(job_ids, "run_id"):
        job_ids = [job_ids]
    return [str(getattr(j, "run_id", j)) for j in job_ids]


def _why_not_finished(job_id: str, run) -> str:
    """A sentence on a job that has no complete record, with the cause when the scheduler knows it."""
    try:
        from .jobs import job_outcome

        outcome = job_outcome(job_id)
        state, cause = outcome.state, outcome.cause
    except Exception:
        state, cause = None, ""
    if state in ("RUNNING", "PENDING"):
        return f"job {job_id} is still {state.lower()}: run the queue cell above until it ends, then this one"
    if run.state == "missing":
        head = f"job {job_id} left no run record"
    else:
        head = f"job {job_id} did not finish ({run.state})"
    if state:
        head += f"; the scheduler says {state}"
    last = cause.strip().splitlines()[-1] if cause and cause.strip() else ""
    last = last or (run.error or "")
    if last:
        head += f" — {last[:200]}"
    if run.oom or state == "OUT_OF_MEMORY":
        head += ". It ran out of memory: lower the batch size (or use mixed precision)"
    return head + ". Read its log (dlokit.search_log(contains='" + job_id + "', with_err=True)), fix, resubmit"


def _load(job_id):
    """(Run, None) for a completed run, else (Run or None, a sentence saying what is wrong)."""
    from .analysis import load_run
    from .profiles import current_profile

    run = load_run(job_id, current_profile().runs)
    if run.state != "completed":
        return run, _why_not_finished(str(job_id), run)
    return run, None


def observed(run) -> dict:
    """What the script saw on its first step (run.json, else summary.json); {} when absent."""
    return run.info.get("observed") or run.summary.get("observed") or {}


def _on_gpu(run) -> bool:
    hardware = run.info.get("hardware") or {}
    return bool(hardware.get("gpu_count")) and run.config.get("device", "auto") != "cpu"


def _first_problem(job_ids, name):
    """Load every run; return (runs, failing CheckResult or None)."""
    ids = _ids(job_ids)
    if not ids:
        return [], CheckResult(name, False, "no job id given: pass the ids the submission cell returned")
    runs, problems = [], []
    for job_id in ids:
        run, problem = _load(job_id)
        if problem:
            problems.append(problem)
        else:
            runs.append(run)
    if problems:
        return runs, CheckResult(name, False, problems[0], problems[1:])
    missing = [r.run_id for r in runs if not observed(r)]
    if missing:
        return runs, CheckResult(name, False, f"run(s) {', '.join(missing)} recorded no 'observed' block: "
                                 "were they made by the kit's train_classifier.py?")
    return runs, None


def _ratio_text(label, value, base, unit, higher_is_better=True):
    if value is None or base is None or base == 0:
        return None, f"{label}: not measured"
    ratio = value / base
    better = ratio > 1 if higher_is_better else ratio < 1
    return better, f"{label}: {value:.4g} {unit} vs {base:.4g} {unit} (×{ratio:.2f})"


# ---- Day 1 --------------------------------------------------------------------------------------

@_check("job completed")
def completed(job_ids) -> CheckResult:
    """The jobs ended well and wrote a complete run record (TP1.0 and any baseline)."""
    runs, problem = _first_problem(job_ids, "job completed")
    if problem:
        return problem
    details = [f"run {r.run_id}: {r.summary.get('steps')} steps, "
               f"{as_number(r.summary.get('throughput_train')) or float('nan'):.1f} img/s on "
               f"{observed(r).get('device', '?')}" for r in runs]
    return CheckResult("job completed", True, f"{len(runs)} run(s) completed", details)


@_check("TP1.1 model and batches on the device")
def on_device(job_ids) -> CheckResult:
    name = "TP1.1 model and batches on the device"
    runs, problem = _first_problem(job_ids, name)
    if problem:
        return problem
    details, failed = [], []
    for run in runs:
        seen = observed(run)
        batch, weights = str(seen.get("device")), str(seen.get("model_device"))
        memory = run.summary.get("gpu_mem_peak_mb") or run.summary.get("host_rss_peak_mb")
        where = "GPU" if run.summary.get("gpu_mem_peak_mb") is not None else "host"
        details.append(f"run {run.run_id} (batch {run.config.get('batch_size')}): batch on {batch}, weights on "
                       f"{weights}, {where} peak {memory or float('nan'):.0f} MiB")
        if _on_gpu(run) and not (batch.startswith("cuda") and weights.startswith("cuda")):
            failed.append(f"run {run.run_id} had a GPU but computed with the batch on {batch} and the weights on "
                          f"{weights}: move both with .to(device) (TODO TP1.1)")
        elif batch != weights:
            failed.append(f"run {run.run_id}: batch on {batch} but weights on {weights}")
    if failed:
        return CheckResult(name, False, failed[0], failed[1:] + details)
    if not any(_on_gpu(r) for r in runs):
        return CheckResult(name, True, "everything ran on the CPU, which is all this machine has: nothing to "
                           "move here (on a GPU node this check verifies that weights and batches are on cuda)",
                           details)
    return CheckResult(name, True, "weights and batches were on the GPU", details)


def _precision_line(run, base):
    speed_better, speed = _ratio_text("compute throughput", as_number(run.summary.get("throughput_compute")),
                                      as_number(base.summary.get("throughput_compute")) if base else None, "img/s")
    mem_key = "gpu_mem_peak_mb" if run.summary.get("gpu_mem_peak_mb") is not None else "host_rss_peak_mb"
    mem_better, memory = _ratio_text(mem_key, as_number(run.summary.get(mem_key)),
                                     as_number(base.summary.get(mem_key)) if base else None, "MiB",
                                     higher_is_better=False)
    return speed_better, mem_better, f"{speed}; {memory}"


@_check("TP1.2 mixed precision")
def amp(baseline_id, amp_ids) -> CheckResult:
    """AMP runs computed their logits in 16 bits (and fp16 used a GradScaler); faster or smaller on GPU."""
    name = "TP1.2 mixed precision"
    base, problem = _load(baseline_id)
    if problem:
        return CheckResult(name, False, f"baseline: {problem}")
    runs, problem = _first_problem(amp_ids, name)
    if problem:
        return problem
    details, failed, gains = [], [], []
    for run in runs:
        wanted = AMP_DTYPES.get(run.config.get("amp"))
        seen = observed(run)
        got = seen.get("amp_dtype")
        speed_better, mem_better, line = _precision_line(run, base)
        details.append(f"run {run.run_id} --amp {run.config.get('amp')}: logits in {got}; {line}")
        if wanted is None:
            failed.append(f"run {run.run_id} was not started with --amp bf16 or --amp fp16")
        elif got != wanted:
            failed.append(f"run {run.run_id} asked for {wanted} but its logits came out in {got}: run the forward "
                          "pass and the loss inside torch.autocast(device.type, dtype=...) (TODO TP1.2)")
        elif wanted == "float16" and not seen.get("grad_scaler"):
            failed.append(f"run {run.run_id} computed in float16 without a GradScaler: small gradients flush to "
                          "zero; create torch.amp.GradScaler(enabled=args.amp == 'fp16') and use scale/step/update")
        gains.append((run, speed_better, mem_better))
    if failed:
        return CheckResult(name, False, failed[0], failed[1:] + details)
    on_gpu = [g for g in gains if _on_gpu(g[0])]
    if on_gpu and not any(s or m for _, s, m in on_gpu):
        return CheckResult(name, False, "the dtype is right but nothing got faster or smaller than the fp32 "
                           "baseline: is the batch big enough to keep the tensor cores busy?", details)
    if not on_gpu:
        return CheckResult(name, True, "the forward pass really ran in 16 bits; on a CPU the speed is "
                           "information only (tensor cores are a GPU feature)", details)
    return CheckResult(name, True, "16-bit compute observed, and the step got faster or lighter", details)


@_check("TP1.3 channels_last")
def channels_last(job_ids, baseline_id=None) -> CheckResult:
    name = "TP1.3 channels_last"
    runs, problem = _first_problem(job_ids, name)
    if problem:
        return problem
    base = _load(baseline_id)[0] if baseline_id is not None else None
    base = base if base is not None and base.state == "completed" else None
    details, failed = [], []
    for run in runs:
        seen = observed(run)
        _, _, line = _precision_line(run, base)
        details.append(f"run {run.run_id}: NHWC images {seen.get('channels_last_input')}, NHWC weights "
                       f"{seen.get('channels_last_weights')}" + (f"; {line}" if base else ""))
        if not run.config.get("channels_last"):
            failed.append(f"run {run.run_id} was not started with --channels-last")
        elif not seen.get("channels_last_weights"):
            failed.append(f"run {run.run_id}: the convolution weights are still NCHW; convert the model with "
                          "model.to(memory_format=torch.channels_last) (TODO TP1.3)")
        elif not seen.get("channels_last_input"):
            failed.append(f"run {run.run_id}: the images are still NCHW; convert each batch with "
                          "images.contiguous(memory_format=torch.channels_last) (TODO TP1.3)")
    if failed:
        return CheckResult(name, False, failed[0], failed[1:] + details)
    return CheckResult(name, True, "weights and images were in channels_last (NHWC) layout", details)


def _trace_events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    return data["traceEvents"] if isinstance(data, dict) else data


def run_traces(run) -> list[Path]:
    from .analysis import trace_files

    return trace_files(Path(run.path) / "profile") if (Path(run.path) / "profile").is_dir() else []


@_check("TP1.4 profiler trace")
def profiler(job_ids) -> CheckResult:
    """Each run left a trace file, and the trace shows the labelled phases of a step."""
    name = "TP1.4 profiler trace"
    runs, problem = _first_problem(job_ids, name)
    if problem:
        return problem
    details, failed = [], []
    for run in runs:
        files = run_traces(run)
        if not run.config.get("profile"):
            failed.append(f"run {run.run_id} was not started with --profile")
            continue
        if not files:
            failed.append(f"run {run.run_id} wrote no trace under {run.path}/profile: create a torch.profiler."
                          "profile with a schedule and tensorboard_trace_handler, start it, and call "
                          "profiler.step() every step (TODO TP1.4)")
            continue
        names = {str(e.get("name")) for e in _trace_events(files[-1])}
        labels = [label for label in PHASE_LABELS if label in names]
        steps = len([n for n in names if n.startswith("ProfilerStep#")])
        details.append(f"run {run.run_id}: {len(files)} trace file(s), {steps} profiled step(s), "
                       f"labelled spans: {', '.join(labels) or 'none'}")
        if len(labels) < len(PHASE_LABELS):
            missing = [label for label in PHASE_LABELS if label not in labels]
            failed.append(f"run {run.run_id}: the trace has no span named {', '.join(missing)}: wrap each phase in "
                          "torch.profiler.record_function(name) (TODO TP1.4)")
    if failed:
        return CheckResult(name, False, failed[0], failed[1:] + details)
    return CheckResult(name, True, "trace files written, with data/forward/backward/optimizer spans", details)


# ---- Day 2 --------------------------------------------------------------------------------------

@_check("TP2.1 DataLoader tuned")
def dataloader(baseline_id, tuned_id) -> CheckResult:
    """The tuned run's loader really used workers (and pinning on GPU), and loading got faster."""
    name = "TP2.1 DataLoader tuned"
    base, problem = _load(baseline_id)
    if problem:
        return CheckResult(name, False, f"baseline: {problem}")
    runs, problem = _first_problem(tuned_id, name)
    if problem:
        return problem
    run = runs[-1]
    seen, config = observed(run), run.config
    details = [f"run {run.run_id}: workers {seen.get('loader_num_workers')}, pin_memory {seen.get('loader_pin_memory')}"
               f" (batch pinned: {seen.get('batch_pinned')}), prefetch {seen.get('loader_prefetch_factor')}, "
               f"persistent {seen.get('loader_persistent_workers')}, non_blocking {seen.get('non_blocking')}"]
    failed = []
    if not config.get("num_workers"):
        failed.append(f"run {run.run_id} was started with --num-workers 0: nothing to check")
    elif seen.get("loader_num_workers") != config["num_workers"]:
        failed.append(f"run {run.run_id} asked for {config['num_workers']} workers but its DataLoader used "
                      f"{seen.get('loader_num_workers')}: pass num_workers (and the other options) to DataLoader "
                      "(TODO TP2.1)")
    elif seen.get("loader_prefetch_factor") != config.get("prefetch_factor"):
        failed.append(f"run {run.run_id}: prefetch_factor {seen.get('loader_prefetch_factor')} in effect, "
                      f"{config.get('prefetch_factor')} asked")
    elif config.get("persistent_workers") and not seen.get("loader_persistent_workers"):
        failed.append(f"run {run.run_id}: --persistent-workers asked but the workers are not persistent")
    elif config.get("pin_memory") and _on_gpu(run) and not seen.get("batch_pinned"):
        failed.append(f"run {run.run_id}: --pin-memory asked but the batches are not in pinned memory")
    elif config.get("non_blocking") and not seen.get("non_blocking"):
        failed.append(f"run {run.run_id}: --non-blocking asked but the copies are blocking")
    better, line = _ratio_text("load time per step", as_number(run.summary.get("t_data")),
                               as_number(base.summary.get("t_data")), "s", higher_is_better=False)
    details.append(line + f" (baseline run {base.run_id})")
    if failed:
        return CheckResult(name, False, failed[0], failed[1:] + details)
    if not _on_gpu(run):
        return CheckResult(name, True, "the loader options are in effect; on a CPU-only machine the workers compete "
                           "with the training for the same cores, so the load time is information only", details)
    if better is False:
        return CheckResult(name, False, f"the options are in effect but loading did not get faster than run "
                           f"{base.run_id}; try more workers or a larger prefetch factor", details)
    return CheckResult(name, True, "the loader options are in effect and the load time per step dropped", details)


@_check("TP2.2 data parallelism")
def ddp(job_ids, world_size: int | None = None) -> CheckResult:
    """Every multi-process run: DDP-wrapped, sharded sampler, every rank finished, identical weights."""
    name = "TP2.2 data parallelism"
    runs, problem = _first_problem(job_ids, name)
    if problem:
        return problem
    details, failed = [], []
    sizes = sorted(r.world_size for r in runs)
    if world_size is not None and world_size not in sizes:
        failed.append(f"no run with {world_size} processes among these (world sizes: {sizes})")
    for run in runs:
        n = run.world_size
        seen = observed(run)
        summaries = run.summaries
        identical = [s.get("params_identical_across_ranks") for s in summaries]
        shard = seen.get("samples_per_rank_per_epoch")
        images = run.config.get("train_images")
        details.append(f"run {run.run_id}: {n} process(es), {len(summaries)} summary file(s), DDP "
                       f"{seen.get('ddp_wrapped')}, sampler {seen.get('sampler')} ({shard} of {images} images per "
                       f"rank), identical weights {all(identical) if identical else None}")
        if n == 1:
            continue
        if len(summaries) < n:
            failed.append(f"run {run.run_id}: only {len(summaries)} of {n} ranks finished")
        elif not seen.get("ddp_wrapped") or seen.get("ddp_world_size") != n:
            failed.append(f"run {run.run_id}: the model is not wrapped in DistributedDataParallel, so each rank "
                          "trains its own copy (TODO TP2.2)")
        elif not all(identical):
            failed.append(f"run {run.run_id}: the ranks ended with different weights: gradients were not averaged")
        elif images and shard and shard > math.ceil(images / n):
            failed.append(f"run {run.run_id}: each rank reads {shard} images per epoch, the whole set: use a "
                          "DistributedSampler so that each rank reads its own 1/N shard (TODO TP2.2)")
    if failed:
        return CheckResult(name, False, failed[0], failed[1:] + details)
    return CheckResult(name, True, f"{max(sizes)} processes trained one model: DDP on, each rank on its own "
                       "shard, weights identical on every rank", details)


@_check("TP2.3 SyncBatchNorm")
def sync_bn(job_ids) -> CheckResult:
    name = "TP2.3 SyncBatchNorm"
    runs, problem = _first_problem(job_ids, name)
    if problem:
        return problem
    bad = [r.run_id for r in runs if r.config.get("sync_bn") and not observed(r).get("sync_bn")]
    details = [f"run {r.run_id}: --sync-bn {r.config.get('sync_bn')}, SyncBatchNorm layers "
               f"{observed(r).get('sync_bn')}, {r.world_size} processes" for r in runs]
    if bad:
        return CheckResult(name, False, f"run(s) {', '.join(bad)} asked for --sync-bn but kept plain BatchNorm: "
                           "convert with nn.SyncBatchNorm.convert_sync_batchnorm before wrapping in DDP", details)
    return CheckResult(name, True, "BatchNorm layers are what each run asked for", details)


def collectives_in_trace(path) -> "pandas.DataFrame":
    """Collectives seen in a profiler trace (recorded with record_shapes): calls and bytes per kind.

    Reads the `c10d::<collective>` operator events, whose input shapes and dtypes give the message size.
    """
    import pandas as pd

    rows = []
    for event in _trace_events(Path(path)):
        event_name = str(event.get("name", ""))
        if not event_name.startswith("c10d::") or event.get("ph") != "X":
            continue
        args = event.get("args") or {}
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        elements = 0
        for dim in dims[:1]:  # the first input is the tensor (list) being communicated
            shapes = dim if dim and isinstance(dim[0], list) else [dim]
            elements = sum(math.prod(s) for s in shapes if s)
        dtype = next((t for t in types if t in TYPE_BYTES), "float")
        rows.append({"collective": event_name.removeprefix("c10d::").rstrip("_"), "elements": elements,
                     "bytes": elements * TYPE_BYTES.get(dtype, 4)})
    table = pd.DataFrame(rows, columns=["collective", "elements", "bytes"])
    if table.empty:
        return pd.DataFrame(columns=["collective", "calls", "MiB"])
    out = table.groupby("collective").agg(calls=("bytes", "size"), MiB=("bytes", "sum")).reset_index()
    out["MiB"] = out["MiB"] / 2**20
    return out


# ---- the whole day ------------------------------------------------------------------------------

def scoreboard():
    """A table of every check shown in this session (latest result per check)."""
    import pandas as pd

    latest = {}
    for result in RESULTS:
        latest[result.check] = result
    return pd.DataFrame([{"check": r.check, "result": r.mark, "message": r.message} for r in latest.values()],
                        columns=["check", "result", "message"])


def results_in_notebook(path) -> list[dict]:
    """Every check result stored in an executed notebook's outputs (what the tests read)."""
    notebook = json.loads(Path(path).read_text())
    found = []
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if MIME in data:
                value = data[MIME]
                found.append(json.loads(value) if isinstance(value, str) else value)
    return found
