"""The doctor's compile probe compiles where the course compiles (a GPU when the job has one) and says where."""
import json
import os
import subprocess
import sys

from dlokit.doctor import probe, probe_jobs
from dlokit.doctor.report import FAILED, PASSED


def probe_line(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-u", probe.__file__, "compile"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(probe.MARK)]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-2000:]
    return json.loads(lines[0][len(probe.MARK):])


def test_a_job_without_a_gpu_compiles_on_the_cpu_and_says_triton_was_not_tested(tmp_path):
    line = probe_line({"CUDA_VISIBLE_DEVICES": "", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")})
    assert (line["device"], line["backend"], line["same"]) == ("cpu", "cpp", True)
    assert line["cache"] == str(tmp_path / "cache") and "gpu" not in line
    finding = probe_jobs.compile_judged(line)
    assert finding.status == PASSED
    assert "on the CPU" in finding.message and "Triton was not tested" in finding.message


def test_a_gpu_line_names_the_gpu_and_a_triton_failure_gets_its_fix():
    gpu = {"device": "cuda", "backend": "triton", "gpu": "NVIDIA H100 80GB HBM3", "cache": ""}
    ok = probe_jobs.compile_judged({**gpu, "same": True, "seconds": 4.2})
    assert ok.status == PASSED and "on NVIDIA H100 80GB HBM3 (Inductor's Triton kernels)" in ok.message
    broken = probe_jobs.compile_judged({**gpu, "error": "BackendCompilerFailed: Cannot find a working triton"})
    assert broken.status == FAILED and "triton" in broken.fix and "g++" not in broken.fix
    cpu_broken = probe_jobs.compile_judged({"device": "cpu", "backend": "cpp", "cache": "",
                                            "error": "InvalidCxxCompiler: No working C++ compiler found"})
    assert cpu_broken.status == FAILED and "g++" in cpu_broken.fix
