"""Parallel degrees, and the one device mesh every parallelism takes its ranks from (torchtitan's ParallelDims).

    dims = ParallelDims.for_mode("hsdp", world_size=4, dp_replicate=2)   # dp_replicate 2 x dp_shard 2
    mesh = dims.build_mesh("cpu")                                         # dims of size > 1, outermost first
    mesh["dp_shard"], mesh["tp"], dims.data_parallel_rank(mesh), ...

Five degrees, whose product is the world size:
    pp            pipeline stages (consecutive blocks on consecutive ranks)
    dp_replicate  whole replicas of the model (DDP), or of the FSDP shards (HSDP)
    dp_shard      FSDP: weights, gradients and optimizer states split over these ranks
    cp            context parallel: the sequence split over these ranks
    tp            tensor parallel: every block's linears split over these ranks
The data-parallel degree (how many different slices of the global batch) is dp_replicate x dp_shard.
`--mode` is a shortcut for a set of degrees (MODE_TABLE); zero1 is DDP's layout whose optimizer
states are sharded over the replicas (ZeroRedundancyOptimizer), and tp-scratch is tp with the
hand-written layers of parallel_tp_scratch.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost (slowest links) first


@dataclass(frozen=True)
class ParallelDims:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    zero1: bool = False          # dp_replicate ranks shard the optimizer states (ZeRO stage 1)
    tp_scratch: bool = False     # tensor parallel with the from-scratch layers, not DTensor

    @classmethod
    def for_mode(cls, mode: str, world_size: int, tp: int = 2, dp_replicate: int = 2) -> "ParallelDims":
        """The degrees --mode stands for; `tp` is fsdp-tp's tensor degree, `dp_replicate` hsdp's replicas."""
        w = world_size
        table = {
            "single": {},
            "ddp": {"dp_replicate": w},
            "zero1": {"dp_replicate": w, "zero1": True},
            "fsdp": {"dp_shard": w},
            "hsdp": {"dp_replicate": dp_replicate, "dp_shard": w // dp_replicate if dp_replicate else 0},
            "tp-scratch": {"tp": w, "tp_scratch": True},
            "tp": {"tp": w},
            "fsdp-tp": {"dp_shard": w // tp if tp else 0, "tp": tp},
            "pp": {"pp": w},
            "cp": {"cp": w},
        }
        return cls(**table[mode])

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: ranks that read different slices of the global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> bool:
        """Weights sharded by FSDP2: over dp_shard (HSDP when dp_replicate > 1 too), or over the CP ranks."""
        return self.dp_shard > 1 or self.cp > 1

    @property
    def ddp(self) -> bool:
        return self.dp_replicate > 1 and not self.fsdp

    @property
    def data_parallel(self) -> str | None:
        """How the data-parallel ranks keep the model: ddp, zero1, fsdp, hsdp, or None."""
        if self.fsdp:
            return "hsdp" if self.dp_replicate > 1 else "fsdp"
        if self.dp_replicate > 1:
            return "zero1" if self.zero1 else "ddp"
        return None

    def degrees(self) -> dict:
        """What the run record keeps: the five degrees, dp and the data-parallel strategy."""
        fields = asdict(self)
        return {**{name: fields[name] for name in MESH_ORDER}, "dp": self.dp, "data_parallel": self.data_parallel}

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """One mesh over every rank, with a named dimension per degree above 1 (None for one process)."""
        names = [name for name in MESH_ORDER if getattr(self, name) > 1]
        if not names:
            return None
        return init_device_mesh(device_type, tuple(getattr(self, n) for n in names), mesh_dim_names=tuple(names))

    def has(self, name: str) -> bool:
        return getattr(self, name) > 1

    def fsdp_mesh(self, mesh: DeviceMesh):
        """What FSDP2 shards over: dp_shard (or the CP ranks), with dp_replicate in front for HSDP."""
        shard = "dp_shard" if self.has("dp_shard") else "cp"
        return mesh[("dp_replicate", shard)] if self.has("dp_replicate") else mesh[shard]

    def data_parallel_rank(self, mesh: DeviceMesh | None) -> tuple[int, int]:
        """(this rank's slice, number of slices) of the global batch."""
        rank = 0
        for name in ("dp_replicate", "dp_shard"):
            if self.has(name):
                rank = rank * getattr(self, name) + mesh.get_local_rank(name)
        return rank, self.dp

    def loss_groups(self, mesh: DeviceMesh | None) -> list:
        """The groups over which the logged loss is averaged: ranks that saw different tokens."""
        return [mesh.get_group(name) for name in ("dp_replicate", "dp_shard", "cp") if self.has(name)]
