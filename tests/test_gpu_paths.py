"""GPU code paths of the image script and dlokit.in_job.measure, tested on a machine without a GPU: NVML is a fake
module (sys.modules), the CUDA device properties are fakes, the TF32 flags are PyTorch's own (they can be
set and read without a GPU)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tomllib
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from dlokit.in_job import measure
from tp_imports import common, load_script  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tp_scripts" / "solutions" / "train_classifier.py"


def load_solution():
    return load_script(SCRIPT, "train_classifier_gpu_paths")


# ---- energy: NVML's handle is the GPU this process uses, whatever CUDA_VISIBLE_DEVICES hides -------------

PHYSICAL = [f"4f1c0d2a-0000-4000-8000-00000000000{i}" for i in range(4)]  # the machine's 4 GPUs, NVML order


class FakeNVML(types.ModuleType):
    """pynvml over 4 GPUs: handles are NVML indices; GPU i has used i * 1000 J so far, +1 J per reading."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, uuid_lookup=True):
        super().__init__("pynvml")
        self.uuid_lookup = uuid_lookup
        self.readings = [0] * 4
        self.by_index = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        self.by_index.append(index)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if not self.uuid_lookup or not uuid.startswith("GPU-") or uuid[4:] not in PHYSICAL:
            raise self.NVMLError("Not Found")
        return PHYSICAL.index(uuid[4:])

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        bus = int(bus_id.split(":")[1], 16)
        if not bus_id.startswith("00000000:") or not bus_id.endswith(":00.0") or bus not in (0x18, 0x3B, 0x86, 0xAF):
            raise self.NVMLError("Not Found")
        return (0x18, 0x3B, 0x86, 0xAF).index(bus)

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{PHYSICAL[handle]}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.readings[handle] += 1
        return handle * 1_000_000 + self.readings[handle] * 1000  # millijoules

    def nvmlDeviceGetPowerUsage(self, handle):
        return 100_000 + handle * 10_000  # milliwatts


class FakeUUID:
    """torch's _CUuuid: str() is the bare 8-4-4-4-12 form."""

    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


@pytest.fixture
def visible_gpu_3(monkeypatch):
    """A job given physical GPU 3 alone: CUDA sees one device, cuda:0, which is NVML's GPU 3."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")

    def properties(index):
        physical = [int(i) for i in os.environ["CUDA_VISIBLE_DEVICES"].split(",")][index]
        return types.SimpleNamespace(uuid=FakeUUID(PHYSICAL[physical]), pci_domain_id=0,
                                     pci_bus_id=(0x18, 0x3B, 0x86, 0xAF)[physical], pci_device_id=0)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_energy_reads_the_gpu_of_the_process_not_nvml_index_0(monkeypatch, visible_gpu_3):
    nvml = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    meter = measure.EnergyMeter(torch.device("cuda", 0))
    assert nvml.by_index == []  # never by index: NVML's index 0 is another GPU
    assert meter.gpu_uuid == f"GPU-{PHYSICAL[3]}"
    assert meter.energy_j() == pytest.approx(1.0)  # GPU 3's counter: one reading later, +1 J
    assert meter.sample_power() == pytest.approx(130.0) and meter.peak_power_w == pytest.approx(130.0)
    summary = meter.summary()
    assert summary["gpu_uuid"] == f"GPU-{PHYSICAL[3]}" and summary["energy_unavailable"] is None
    assert summary["energy_wh"] == pytest.approx(summary["energy_j"] / 3600)
    assert summary["gpu_hours"] > 0
    assert nvml.readings[0] == 0  # GPU 0 (another job's, or every rank's by mistake) never read


def test_energy_falls_back_to_the_pci_bus_id(monkeypatch, visible_gpu_3):
    nvml = FakeNVML(uuid_lookup=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    meter = measure.EnergyMeter(torch.device("cuda", 0))
    assert meter.gpu_uuid == f"GPU-{PHYSICAL[3]}" and meter.energy_j() == pytest.approx(1.0)
    assert nvml.by_index == []


def test_energy_is_none_without_nvml_and_on_the_cpu(monkeypatch, visible_gpu_3):
    class Broken(FakeNVML):
        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    meter = measure.EnergyMeter(torch.device("cuda", 0))
    assert meter.energy_j() is None and meter.sample_power() is None and meter.gpu_uuid is None
    assert "Not Found" in meter.summary()["energy_unavailable"]
    cpu = measure.EnergyMeter(torch.device("cpu")).summary()
    assert cpu == {"energy_j": None, "energy_wh": None, "peak_power_w": None, "gpu_uuid": None,
                   "gpu_hours": None, "energy_unavailable": None}


def test_pynvml_is_a_dependency_and_imports_without_a_gpu():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("nvidia-ml-py") for d in dependencies)
    pynvml = importlib.import_module("pynvml")
    assert hasattr(pynvml, "nvmlDeviceGetHandleByUUID") and hasattr(pynvml, "nvmlDeviceGetHandleByPciBusId")
    if not torch.cuda.is_available():  # the real module, no driver: no reading, no crash
        meter = measure.EnergyMeter(torch.device("cuda", 0))
        assert meter.energy_j() is None and meter.summary()["energy_unavailable"]


# ---- SyncBatchNorm: --sync-bn converts on one GPU too -------------------------------------------------------

def test_sync_bn_is_converted_on_a_single_rank():
    script = load_solution()
    args = types.SimpleNamespace(sync_bn=True, find_unused_parameters=False, static_graph=False,
                                 gradient_as_bucket_view=False, bucket_cap_mb=None)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    converted = script.parallelize(model, args, torch.device("cuda", 0), world_size=1)  # one GPU: no DDP
    assert any(isinstance(m, nn.SyncBatchNorm) for m in converted.modules())
    # without a process group SyncBatchNorm computes plain BatchNorm statistics (so even a CPU forward works)
    assert converted(torch.randn(2, 3, 8, 8)).shape == (2, 4, 6, 6)
    plain = script.parallelize(nn.Sequential(nn.BatchNorm2d(4)), types.SimpleNamespace(**{**vars(args), "sync_bn": False}),
                               torch.device("cuda", 0), world_size=1)
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in plain.modules())


# ---- TF32: the new API set, the legacy flags still readable ---------------------------------------------------

@pytest.fixture
def tf32_restored():
    b = torch.backends
    saved = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)
    yield
    # back to PyTorch's defaults as they were (legacy flags first: they reset the new ones)
    torch.backends.cuda.matmul.allow_tf32 = saved[0] == "tf32"
    torch.backends.cudnn.allow_tf32 = saved[1] == "tf32"
    b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision = saved


def test_set_tf32_leaves_the_legacy_flags_readable(tf32_restored):
    set_tf32 = common("device_setup").set_tf32
    from dlokit.in_job.measure import tf32_enabled

    for enabled in (False, True, False):
        set_tf32(enabled)
        assert torch.backends.cuda.matmul.allow_tf32 is enabled  # raised "mix of the legacy and new APIs"
        assert torch.backends.cudnn.allow_tf32 is enabled
        torch.get_float32_matmul_precision()  # read by torch.compile paths: must not raise either
        assert tf32_enabled() is enabled
        if hasattr(torch.backends.cudnn, "conv"):
            expected = "tf32" if enabled else "ieee"
            assert torch.backends.cuda.matmul.fp32_precision == expected
            assert torch.backends.cudnn.conv.fp32_precision == expected
