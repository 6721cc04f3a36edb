"""GPU-hours and energy of a run: what the race plan, the leaderboard and the class report show.

GPU-hours are always known: elapsed time x devices (GPUs, or CPU processes on a machine without
GPUs). Energy comes from the counters the run read while it ran:

* on GPUs, NVML's energy counter (summary.json `energy_j`, one counter per `gpu_uuid`: see
  dlokit.in_job.measure.EnergyMeter);
* else the host's RAPL counters (/sys/class/powercap/intel-rapl:*/energy_uj, the CPU packages), where the
  kernel exposes them and lets this user read them (summary.json `host_energy_j`, one counter per host);
* else none: shown as "n/a".

HostEnergyMeter is the RAPL reader the training script uses (tp_scripts/common/instrument.py); run_usage and
jobs_usage read records.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .runrecord import is_number

POWERCAP = Path("/sys/class/powercap")
NOT_AVAILABLE = "n/a"


# ---- RAPL, read by the training script ------------------------------------------------------------

def rapl_packages(root: Path = POWERCAP) -> list[Path]:
    """The CPU package zones (intel-rapl:0, intel-rapl:1...; AMD exposes its packages under the same name).
    Sub-zones (core, uncore, dram) and psys (the whole platform) are left out: a package counts its cores."""
    zones = [z for z in sorted(root.glob("intel-rapl:*")) if z.name.count(":") == 1]
    return [z for z in zones if _read_text(z / "name").startswith("package")]


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class HostEnergyMeter:
    """The host's CPU energy since this meter was made, from RAPL. `unavailable` says why there is no reading
    (no powercap zones on this machine, or energy_uj readable by root only, as on most distributions)."""

    def __init__(self, root: Path = POWERCAP):
        self.zones, self.unavailable, self._start = [], None, []
        zones = rapl_packages(root)
        if not zones:
            self.unavailable = f"no RAPL package zone under {root}"
            return
        try:
            self._start = [self._read(zone) for zone in zones]
        except (OSError, ValueError) as error:
            self.unavailable = f"RAPL counters not readable ({getattr(error, 'strerror', None) or error})"
            return
        self.zones = zones

    @staticmethod
    def _read(zone: Path) -> int:
        return int((zone / "energy_uj").read_text())

    def energy_j(self) -> float | None:
        if not self.zones:
            return None
        total = 0
        try:
            for zone, start in zip(self.zones, self._start):
                now = self._read(zone)
                if now < start:  # the counter wrapped around once
                    now += int((zone / "max_energy_range_uj").read_text())
                total += now - start
        except (OSError, ValueError):
            return None
        return total / 1e6

    def summary(self) -> dict:
        """summary.json fields: host_energy_j (RAPL packages), host_energy_counter (one per host: sum once per
        counter, not once per rank), host_energy_unavailable (why not)."""
        energy = self.energy_j()
        return {"host_energy_j": energy, "host_energy_counter": f"rapl@{socket.gethostname()}" if self.zones else None,
                "host_energy_unavailable": self.unavailable}


def process_started_unix() -> float | None:
    """When this process started (Linux: /proc, to the second), before its imports: a run's elapsed time counts
    from here (the run record's `started_unix` is the later import of dlokit.in_job.runrecord, after torch)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


# ---- reading records: GPU-hours and energy per run -------------------------------------------------

@dataclass
class Usage:
    elapsed_s: float | None    # wall clock: process start to end (or to the last line of a killed run)
    gpu_seconds: float | None  # elapsed x devices (GPUs, or CPU processes without GPUs: the world size)
    energy_j: float | None
    energy_source: str | None  # "nvml", "rapl" or None

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpu_seconds is None else self.gpu_seconds / 3600

    @property
    def energy_wh(self) -> float | None:
        return None if self.energy_j is None else self.energy_j / 3600

    @property
    def energy_text(self) -> str:
        return NOT_AVAILABLE if self.energy_wh is None else f"{self.energy_wh:.3g} Wh ({self.energy_source})"

    def __add__(self, other: "Usage") -> "Usage":
        """Two runs together (the segments of a requeued job, a student's jobs): times add; energy stays known
        only if it is known for both."""
        def plus(a, b):
            return None if a is None or b is None else a + b

        energy = plus(self.energy_j, other.energy_j)
        sources = sorted({s for s in (self.energy_source, other.energy_source) if s})
        return Usage(plus(self.elapsed_s, other.elapsed_s), plus(self.gpu_seconds, other.gpu_seconds), energy,
                     "+".join(sources) if energy is not None else None)


def _elapsed_s(run) -> float | None:
    starts, ends = [], []
    for rank in run.ranks.values():
        info, summary = rank.get("run") or {}, rank.get("summary") or {}
        measurement = info.get("measurement") if isinstance(info.get("measurement"), dict) else {}
        started = summary.get("process_started_unix")
        started = started if is_number(started) else measurement.get("started_unix")
        if not is_number(started):
            continue
        starts.append(started)
        if is_number(summary.get("ended_unix")):
            ends.append(summary["ended_unix"])
        else:  # killed: up to its last complete metrics line (times count from about the record's start)
            times = [m["time"] for m in rank.get("metrics") or [] if is_number(m.get("time"))]
            record_start = measurement.get("started_unix") if is_number(measurement.get("started_unix")) else started
            ends.append(record_start + max(times, default=0.0))
    if not starts:
        return None
    return max(0.0, max(ends) - min(starts))


def _energy(run) -> tuple[float | None, str | None]:
    """NVML's GPU energy, summed once per GPU; else RAPL's host energy, once per host; else (None, None).
    Known only when every rank recorded it (a killed rank wrote no summary)."""
    summaries = [r.get("summary") for r in run.ranks.values()]
    if not summaries or not all(isinstance(s, dict) for s in summaries):
        return None, None
    for value_key, counter_key, source in (("energy_j", "gpu_uuid", "nvml"),
                                           ("host_energy_j", "host_energy_counter", "rapl")):
        if all(is_number(s.get(value_key)) for s in summaries):
            per_counter = {s.get(counter_key) or f"rank{rank}": s[value_key] for rank, s in zip(run.ranks, summaries)}
            return float(sum(per_counter.values())), source
    return None, None


def run_usage(run) -> Usage:
    """GPU-hours (always, from the record's times) and energy (n/a when the run read no counter) of one run."""
    energy, source = _energy(run)
    elapsed = _elapsed_s(run)
    return Usage(elapsed, None if elapsed is None else elapsed * run.world_size, energy, source)


def jobs_usage(runs) -> Usage:
    """The total over several runs (the segments of a requeued job, or a student's jobs)."""
    total = None
    for run in runs:
        usage = run_usage(run)
        total = usage if total is None else total + usage
    return total or Usage(0.0, 0.0, None, None)
