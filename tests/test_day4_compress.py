"""Day 4, beyond the course: int8 dynamic quantisation, 2:4 and unstructured pruning of the trained model,
measured (size, inference speed, validation loss) by compress_bench.py and shown by dlokit.analysis.compress."""
import json
import os
import sys
from pathlib import Path

import preloaded
import pytest
import torch

from dlokit.analysis.compress import compression_plot, compression_table
from tp_imports import common, load_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tp_scripts" / "llm"
compress = common("compress", llm=True)
compress_bench = load_script(LLM / "compress_bench.py")
model_lib = common("model", llm=True)


def run_bench(tmp_path, run_id, *options):
    env = {**os.environ, "DLOKIT_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    return preloaded.run([sys.executable, str(LLM / "compress_bench.py"), *options, "--runs-dir", str(tmp_path)],
                         env=env, timeout=300)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    runs = tmp_path_factory.mktemp("compress")
    result = run_bench(runs, "bench", "--config", "tiny", "--train-steps", "100", "--sparsities", "0.5", "0.9",
                       "--eval-batches", "2", "--repeats", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    return runs, json.loads((runs / "bench" / "rank0" / "summary.json").read_text())


def test_compression_shrinks_the_weights_and_costs_loss(bench):
    runs, summary = bench
    rows = {row["variant"]: row for row in summary["results"]}
    assert list(rows) == ["fp32", "int8 dynamic", "2:4", "unstructured 50%", "unstructured 90%"]
    fp32 = rows["fp32"]["size_bytes"]
    assert rows["int8 dynamic"]["size_bytes"] < 0.6 * fp32                    # int8 weights: ~1/4 of the blocks
    assert rows["2:4"]["size_bytes"] == pytest.approx(fp32, rel=0.01)         # the zeros are still stored...
    assert rows["2:4"]["size_bytes_sparse"] < 0.75 * fp32                     # ...unless packed
    assert rows["2:4"]["zero_fraction"] == pytest.approx(0.5)
    for sparsity in (0.5, 0.9):
        assert rows[f"unstructured {sparsity:.0%}"]["zero_fraction"] == pytest.approx(sparsity, abs=0.01)
    # CSR pays only at high sparsity: a value and an index per kept weight
    assert rows["unstructured 50%"]["size_bytes_sparse"] > 0.9 * fp32 > rows["unstructured 90%"]["size_bytes_sparse"]
    # the trained model loses more the more is removed; int8 costs little
    assert rows["unstructured 90%"]["val_loss_increase"] > rows["unstructured 50%"]["val_loss_increase"]
    assert rows["unstructured 90%"]["val_loss_increase"] > 0.05
    assert abs(rows["int8 dynamic"]["val_loss_increase"]) < 0.05
    assert summary["baseline_val_loss"] < 4.0  # it was trained: 5.5 is a uniform guess over 256 bytes
    assert all(row["tokens_per_s"] > 0 for row in rows.values())


def test_compression_views(bench):
    runs, _ = bench
    table = compression_table("bench", runs)
    assert list(table["method"]) == ["none", "quantize_int8", "prune_2_4", "prune_unstructured", "prune_unstructured"]
    figure = compression_plot("bench", runs)
    assert len(figure.axes[0].lines) >= 5
    assert "no compress lines" in compression_plot("missing", runs).axes[0].texts[0].get_text()


def test_mask_2_4_keeps_the_two_largest_of_every_four_and_packs_them():
    weight = torch.randn(6, 16)
    keep = compress.mask_2_4(weight)
    groups, kept = weight.abs().reshape(6, 4, 4), keep.reshape(6, 4, 4)
    assert (kept.sum(-1) == 2).all()
    assert ((groups * kept).amax(-1) == groups.amax(-1)).all()                     # the largest is kept
    assert ((groups * kept).sum(-1) >= (groups * ~kept).sum(-1)).all()
    packed = compress.packed_2_4(weight * keep)
    positions = torch.stack([(packed["positions"] >> s) & 3 for s in (0, 2, 4, 6)], 1).flatten()[:48].long()
    rebuilt = torch.zeros(6, 4, 4).scatter(-1, positions.reshape(6, 4, 2), packed["values"].reshape(6, 4, 2))
    assert torch.equal(rebuilt.reshape(6, 16), weight * keep)


def test_weights_load_from_a_train_llm_checkpoint(tmp_path):
    checkpoint = common("checkpoint", llm=True)
    config = model_lib.get_config("tiny")
    torch.manual_seed(1)
    trained = model_lib.Llama(config)
    optimizer = torch.optim.AdamW(trained.parameters())
    checkpoint.save_checkpoint(tmp_path / "ckpt", trained, optimizer, step=3)
    torch.manual_seed(2)
    fresh = model_lib.Llama(config)
    compress_bench.load_weights(fresh, tmp_path / "ckpt")
    for (name, a), b in zip(trained.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name


def test_bad_options_exit_2(tmp_path):
    result = run_bench(tmp_path, "bad", "--sparsities", "1.5")
    assert result.returncode == 2 and "--sparsities must lie strictly between 0 and 1" in result.stderr
    result = run_bench(tmp_path, "bad-config", "--config", "huge")
    assert result.returncode == 2 and "unknown model config 'huge'" in result.stderr
    assert "Traceback" not in result.stderr
