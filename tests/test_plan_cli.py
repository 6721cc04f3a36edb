"""`dlokit plan`: the planner on paper for a cluster, in a terminal (issue 52, item 5)."""
import re
import subprocess

import pytest

from dlokit import cli, layout_planner
from dlokit.analysis.llm_memory import model_config

CONFIG = model_config(layout_planner.LLM, "1b")


def _section(out: str, title: str) -> list[str]:
    """The lines after the one starting with `title`, up to the first blank line."""
    lines = out.splitlines() + [""]
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    return lines[start + 1:lines.index("", start)]


def _ranked(out: str, variants: dict) -> list[tuple[str, float]]:
    """The layouts the ranking lists, in order, with their step ms (a row: its number, the layout's name, GiB per
    rank, step ms, ...)."""
    found = []
    for number, line in enumerate(_section(out, "fits (")[2:], start=1):  # the header and the index name first
        first, rest = line.split(maxsplit=1)
        assert int(first) == number
        name = max((name for name in variants if rest.startswith(name + " ")), key=len)
        found.append((name, float(rest[len(name):].split()[1])))
    return found


@pytest.mark.parametrize("gpus", [8, 64])
def test_plan_ranks_only_layouts_that_fit_and_previews_the_first(gpus, capsys, tmp_path):
    argv = ["plan", "--config", "1b", "--n-gpu", str(gpus), "--profile", "jean-zay", "--top", "1000",
            "--preview", "--account", "abc@a100"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "nothing measured" in out and "A100 dense bf16 peak 312 TFLOP/s" in out and "datasheet" in out
    usable = layout_planner.usable_gib(80, gpus)
    variants = {v.name: v for base in layout_planner.base_layouts(gpus) for v in layout_planner.with_levers(base)}
    ranked, steps = zip(*_ranked(out, variants))
    assert len(ranked) >= 5  # by step time, but for ties (layout_planner.TIE): none ranks above a faster one
    assert all(a <= b * (1 + layout_planner.TIE) for i, a in enumerate(steps) for b in steps[i + 1:])
    for name in ranked:  # the memory model, asked again for each layout the ranking lists
        record = layout_planner._record(CONFIG, variants[name], 64, 2048, "bf16")
        assert layout_planner.need_gib(record, cuda=True) <= usable, name

    script = out.split("(as dlokit preview prints it: nothing submitted)\n", 1)[1]
    (tmp_path / "job.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", script)[1])
    per_node = int(re.search(r"#SBATCH --ntasks-per-node=(\d+)", script)[1])
    assert nodes * per_node == gpus  # the layout's ranks, one a GPU
    first = variants[ranked[0]]
    assert first.world == gpus
    command = script.strip().splitlines()[-1]
    assert f"{first.script} {' '.join(first.argv)} --config 1b" in command and "--dtype bf16" in command


def test_plan_names_what_does_not_fit_and_what_the_scripts_refuse(capsys):
    assert cli.main(["plan", "--config", "1b", "--n-gpu", "8", "--gpu-memory", "40", "--profile", "jean-zay"]) == 0
    out = capsys.readouterr().out
    missing = _section(out, "does not fit")
    assert any(line.strip().startswith("DeepSpeed ZeRO-1: needs") for line in missing)
    base_of = {v.name: base.name for base in layout_planner.base_layouts(8) for v in layout_planner.with_levers(base)}
    assert not {line.split(":")[0].strip() for line in missing} & {base_of[n] for n, _ in _ranked(out, base_of)}
    assert cli.main(["plan", "--config", "1b", "--n-gpu", "64", "--profile", "jean-zay"]) == 0
    refused = "\n".join(_section(capsys.readouterr().out, "refused by its script"))
    assert "TP from scratch" in refused and "n_heads = 32 is not divisible by the tensor-parallel degree 64" in refused


def test_plan_refuses_bad_input_with_exit_code_2(capsys):
    assert cli.main(["plan", "--config", "1b", "--n-gpu", "8", "--profile", "jean-zay", "--preview"]) == 2
    assert "needs account" in (err := capsys.readouterr().err) and "--account" in err
    assert cli.main(["plan", "--config", "1b", "--n-gpu", "8", "--profile", "local"]) == 2
    assert "pass --gpu" in capsys.readouterr().err
    assert cli.main(["plan", "--config", "1b", "--n-gpu", "8", "--profile", "jean-zay", "--preview", "99",
                     "--account", "abc@a100"]) == 2
    assert "--preview 99" in capsys.readouterr().err
    assert cli.main(["plan", "--config", "1b", "--n-gpu", "8", "--profile", "jean-zay", "--gpu", "H100", "--preview",
                     "--account", "abc@h100"]) == 2  # an H100 plan, a profile whose nodes are A100s
    assert "the plan is for H100-80GB, but profile 'jean-zay' asks Slurm for --constraint=a100" in capsys.readouterr().err


def _measured(runs, per_rank_flops: float, busbw: float, ranks: int = 8):
    """A comm_bench.py --measure peak job and a comm_bench.py job (every collective at `busbw` bytes/s) of one node."""
    from dlokit.analysis.bus_bandwidth import bus_factor
    from dlokit.in_job.runrecord import RunRecorder

    for rank in range(ranks):
        with RunRecorder({"dtype": "bf16"}, rank=rank, world_size=ranks, run_id="peak", runs_dir=runs) as rec:
            for i in range(5):
                rec.log("matmul", n=8192, dtype="bf16", flops_per_s=per_rank_flops * (1 + 0.01 * (i - 2)))
            rec.finish(peak_flops=per_rank_flops, peak_n=8192, device_type="cuda")
        with RunRecorder({}, rank=rank, world_size=ranks, run_id="comm", runs_dir=runs) as rec:
            for op in ("all_reduce", "all_gather", "reduce_scatter"):
                for n in (2, 4, 8):
                    for size in (2**20, 2**28):
                        for repeat in range(3):
                            rec.log("collective", op=op, ranks=n, bytes=size, repeat=repeat,
                                    time_s=size * bus_factor(op, n) / busbw)
            rec.finish(backend="nccl", device_type="cuda")


def test_plan_on_the_clusters_own_measurements_says_so_and_follows_them(tmp_path, capsys):
    _measured(tmp_path, per_rank_flops=300e12, busbw=2e9)  # a tenth of the datasheet's network, on every link
    base = ["plan", "--config", "1b", "--n-gpu", "16", "--profile", "jean-zay", "--gpu", "H100"]
    assert cli.main(base) == 0
    paper = capsys.readouterr().out
    assert cli.main([*base, "--peak-job", "peak", "--comm-job", "comm", "--runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "measured: jobs peak and comm; collectives timed on 8 ranks at most" in out and "nothing measured" not in out
    assert "matmul peak measured" in out and "bus bandwidths of comm_bench.py run comm (nccl)" in out
    base_of = {v.name: v for base in layout_planner.base_layouts(16) for v in layout_planner.with_levers(base)}
    assert _ranked(out, base_of)[0][1] > _ranked(paper, base_of)[0][1]  # slower links, a slower best step
    assert cli.main([*base, "--peak-job", "peak", "--runs", str(tmp_path)]) == 2
    assert "go together" in capsys.readouterr().err
