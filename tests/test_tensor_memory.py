"""tp_scripts/common/tensor_memory.py: what a step holds in tensors, counted from the tensors (Day 1's memory per
image, and the memory levers of fit_levers.py)."""
import pytest
import torch
import torch.nn as nn

from tp_imports import common

tensor_memory = common("tensor_memory")


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def one_step(model, optimizer, batch: int, meter=None) -> dict:
    images, labels = torch.randn(batch, 3, 16, 16), torch.randint(0, 10, (batch,))
    meter = meter or tensor_memory.TensorMemory(model, optimizer)
    with meter.step():
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return meter.mib()


def test_doubling_the_batch_doubles_the_saved_bytes_and_nothing_else():
    model = small_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    small, large = one_step(model, optimizer, 8), one_step(model, optimizer, 16)
    assert small["saved_mib"] > 0
    assert large["saved_mib"] / small["saved_mib"] == pytest.approx(2.0, rel=0.05)
    weights = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    for mib in (small, large):  # the weights, their gradients and SGD's momentum: one copy each, whatever the batch
        assert mib["params_mib"] == pytest.approx(weights)
        assert mib["grads_mib"] == pytest.approx(weights) and mib["optimizer_mib"] == pytest.approx(weights)
        assert mib["held_mib"] == pytest.approx(mib["saved_mib"] + 3 * weights)
        assert mib["device_peak_mib"] is None  # a CPU: no allocator peak to read


def test_weights_are_not_activations_and_no_grad_saves_nothing():
    model = nn.Linear(256, 256)
    meter = tensor_memory.TensorMemory(model)
    x = torch.randn(4, 256)
    with meter.step():
        model(x).sum().backward()
    assert meter.mib()["saved_mib"] * 2**20 == pytest.approx(4 * 256 * 4)  # the input only, not the 256x256 weight
    with meter.step(), torch.no_grad():
        model(x)
    assert meter.mib()["saved_mib"] == 0 and meter.mib()["optimizer_mib"] == 0


def test_the_peak_is_what_was_alive_at_once_and_the_hooks_go_away():
    model = small_net()
    meter = tensor_memory.TensorMemory(model)
    x = torch.randn(4, 3, 16, 16)
    with meter.step():
        model(x).sum().backward()
        once = meter._counter.peak
        model(x).sum().backward()  # the first graph was freed by its backward: the peak does not add up
    assert meter.result["saved"] == once > 0 and meter._counter.live == 0
    with meter.step():
        kept = [model(x).sum() for _ in range(2)]  # two graphs alive together, sharing their input
    assert meter.result["saved"] == 2 * once - x.numel() * 4  # each storage once: the input counted once
    del kept
    before = meter.result["saved"]
    model(x).sum().backward()  # outside a step: nothing counted
    assert meter.result["saved"] == before
    assert tensor_memory.TensorMemory(model).mib()["held_mib"] is None  # no step yet


def test_autocasts_weight_copies_are_told_from_the_activations():
    """Under bf16 autocast a step also saves 16-bit copies of the weights (a constant): told apart, the activations
    are about half of fp32's and still double with the batch."""
    model = small_net()

    def step(batch, bf16=True):
        meter = tensor_memory.TensorMemory(model)
        with meter.step(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            nn.functional.cross_entropy(model(torch.randn(batch, 3, 16, 16)), torch.randint(0, 10, (batch,))).backward()
        return meter.mib()

    fp32, small, large = step(16, bf16=False), step(8), step(16)
    cast = [m.weight for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]  # what autocast runs in bf16
    assert small["weight_copies_mib"] * 2**20 == sum(w.numel() * 2 for w in cast) == large["weight_copies_mib"] * 2**20
    assert small["activations_mib"] == pytest.approx(small["saved_mib"] - small["weight_copies_mib"])
    assert large["activations_mib"] / small["activations_mib"] == pytest.approx(2.0, rel=0.05)
    assert 0.4 < large["activations_mib"] / fp32["activations_mib"] < 0.75
    assert fp32["weight_copies_mib"] == 0 and fp32["activations_mib"] == fp32["saved_mib"]
