"""Day 4 without launches: argument checks, config arithmetic, the memory model against measurement."""
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlokit.memory_model import estimate, params_on_rank

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tp_scripts" / "llm"))
model_lib = importlib.import_module("model")
train_llm = importlib.import_module("train_llm")


@pytest.mark.parametrize("name", list(model_lib.CONFIGS))
def test_parameter_count_from_config_matches_built_model(name):
    config = model_lib.get_config(name)
    with torch.device("meta"):
        model = model_lib.Llama(config)
    assert model_lib.count_params(config) == sum(p.numel() for p in model.parameters())
    assert params_on_rank(config) == model_lib.count_params(config)


def test_llama_3b_shape():
    assert model_lib.count_params(model_lib.get_config("3b")) == pytest.approx(3.21e9, rel=0.01)


@pytest.mark.parametrize("mode, world, extra, message", [
    ("single", 2, [], "runs one process"),
    ("ddp", 1, [], "needs several processes"),
    ("fsdp-tp", 6, ["--tp", "4"], "not divisible by tp x pp x cp"),
    ("tp", 3, [], "n_heads = 4 is not divisible"),
    ("pp", 3, [], "n_layers = 4 is not divisible"),
    ("pp", 2, ["--microbatches", "3"], "--batch-size 8 is not divisible by --microbatches 3"),
    ("ddp", 3, [], "--batch-size 8 is not divisible by the data-parallel degree 3"),
    ("fsdp", 2, ["--resume"], "--resume needs --checkpoint-dir"),
])
def test_bad_arguments_are_explained(mode, world, extra, message):
    args = train_llm.parse_args(["--mode", mode, *extra])
    config = model_lib.get_config(args.config, max_seq_len=args.seq_len)
    with pytest.raises(train_llm.ArgumentsError, match=message.replace("+", r"\+")):
        train_llm.plan_degrees(args, config, world)


def test_pipeline_refuses_tied_embeddings():
    args = train_llm.parse_args(["--mode", "pp", "--config", "125m"])
    with pytest.raises(train_llm.ArgumentsError, match="tied"):
        train_llm.plan_degrees(args, model_lib.get_config("125m", max_seq_len=64), 2)


def _saved_activation_bytes(model, run):
    """Bytes autograd keeps for backward (saved tensors, each storage once, parameters and buffers excluded)."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in owned and t.is_floating_point():
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run()
    return sum(seen.values()), loss


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_memory_model_matches_measured_states_and_activations(name):
    """Measured on CPU in fp32, one process:
    - weights, gradients, AdamW states: sum of tensor bytes after one step (tolerance 1 %);
    - activations: bytes of the tensors autograd saved for backward (tolerance 5 %).
    """
    torch.manual_seed(0)
    batch, seq = 2, 64
    config = model_lib.get_config(name, max_seq_len=seq)
    model = model_lib.Llama(config)
    tokens = torch.randint(0, config.vocab_size, (batch, seq))
    activations, loss = _saved_activation_bytes(model, lambda: model_lib.loss_fn(model(tokens), tokens))
    loss.backward()
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()
    measured = {
        "weights": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()),
        "optimizer": sum(t.numel() * t.element_size() for s in optimizer.state.values()
                         for k, t in s.items() if k != "step"),
        "activations": activations,
    }
    predicted = estimate(config, batch_size=batch, seq_len=seq, precision="fp32").as_dict()
    for key in ("weights", "gradients", "optimizer"):
        assert predicted[key] == pytest.approx(measured[key], rel=0.01), key
    assert predicted["activations"] == pytest.approx(measured["activations"], rel=0.05)


def test_memory_model_sharding_arithmetic():
    config = SimpleNamespace(dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, ffn_dim=4096, vocab_size=32000,
                             tie_embeddings=False)
    base = estimate(config, batch_size=4, seq_len=256, precision="bf16-mixed")
    psi = params_on_rank(config)
    assert (base.weights, base.gradients, base.optimizer) == (2 * psi, 2 * psi, 12 * psi)
    zero1 = estimate(config, batch_size=4, seq_len=256, dp=4, zero=1)
    zero2 = estimate(config, batch_size=4, seq_len=256, dp=4, zero=2)
    zero3 = estimate(config, batch_size=4, seq_len=256, dp=4, zero=3)
    assert zero1.optimizer == base.optimizer / 4 and zero1.gradients == base.gradients
    assert zero2.gradients == base.gradients / 4 and zero2.weights == base.weights
    assert zero3.weights == base.weights / 4 and zero3.transient > 0
    checkpointed = estimate(config, batch_size=4, seq_len=256, activation_checkpointing=True)
    assert checkpointed.activations < base.activations / 2
    tp = estimate(config, batch_size=4, seq_len=256, tp=4)
    assert base.weights / 4 < tp.weights < base.weights  # embeddings stay replicated
    gpipe = estimate(config, batch_size=8, seq_len=256, pp=4, microbatches=8, pp_schedule="gpipe")
    one_f_one_b = estimate(config, batch_size=8, seq_len=256, pp=4, microbatches=8, pp_schedule="1f1b")
    assert one_f_one_b.activations < gpipe.activations
    with pytest.raises(ValueError):
        estimate(config, batch_size=1, seq_len=8, zero=4)
