"""A local task's script forked warm (dlokit.in_job.warm_start) behaves as `python -u script` would: the same
argv, working directory, environment, cores, output and exit status; it hears the client's signals and dies with
it; the launcher finds it; a small memory limit or DLOKIT_WARM_START=0 starts it cold. Each test has its own
server folder (XDG_RUNTIME_DIR) and ends its server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from dlokit.in_job import warm_start

PROBE = """
import json, os, signal, sys, tempfile, time
import torch
signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), sys.exit(7)))
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "mark": os.environ.get("MARK"), "threads": torch.get_num_threads(),
                  "cores": sorted(os.sched_getaffinity(0)), "parent": os.getppid(), "pid": os.getpid(),
                  "file": __file__, "path0": sys.path[0], "tmp": tempfile.gettempdir()}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if "--wait" in sys.argv:
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def warm(tmp_path, monkeypatch):
    runtime = tmp_path / ("a-folder-deep-enough-that-its-socket-path-is-longer-than-af-unix-takes-" * 2)
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv(warm_start.SWITCH, raising=False)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "probe.py").write_text(PROBE)
    yield tmp_path
    for facts in (runtime / "dlokit-warm").glob("*.json"):  # this test's server ends with it
        try:
            os.kill(json.loads(facts.read_text())["pid"], signal.SIGTERM)
        except (ProcessLookupError, ValueError, KeyError):
            pass


def client(tmp_path, *args, mem_bytes=0, env=None, **popen):
    usage = tmp_path / "usage.json"
    command = warm_start.command(sys.executable, ["../scripts/probe.py", *map(str, args)], mem_bytes, str(usage))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.Popen(command, cwd=work, env={**os.environ, "MARK": "m1", "OMP_NUM_THREADS": "1",
                                                    "TMPDIR": str(tmp_path), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def server_pid(tmp_path) -> int | None:
    facts = list(Path(os.environ["XDG_RUNTIME_DIR"], "dlokit-warm").glob("*.json"))
    return json.loads(facts[0].read_text())["pid"] if facts else None


def ran(process) -> tuple[dict, str, int]:
    out, err = process.communicate(timeout=120)
    return json.loads(out.splitlines()[0]), err, process.returncode


def test_a_forked_script_sees_what_a_fresh_one_sees(warm):
    first = ran(client(warm, 3, "x y"))
    second = ran(client(warm, 3, "x y"))
    cold = ran(client(warm, 3, "x y", env={warm_start.SWITCH: "0"}))
    server = server_pid(warm)
    assert server and second[0]["parent"] == server  # forked by the server, not started by its client
    assert cold[0]["parent"] != server
    for seen, err, code in (first, second, cold):
        assert code == 3 and "to stderr" in err
        assert seen["argv"] == ["../scripts/probe.py", "3", "x y"] and seen["mark"] == "m1"
        assert seen["cwd"] == str(warm / "work") and seen["file"] == str(warm / "work" / ".." / "scripts" / "probe.py")
        assert seen["path0"] == str(warm / "scripts") and seen["tmp"] == str(warm)
        assert seen["threads"] == 1 and seen["cores"] == cold[0]["cores"]


def test_a_script_hears_its_clients_signals_and_dies_with_it(warm):
    ran(client(warm, 0))  # the server is up
    process = client(warm, 0, "--wait")
    seen = json.loads(process.stdout.readline())
    script = warm_start.adopted(process.pid)
    assert script.pid == seen["pid"]  # what the launcher's memory watch follows
    assert script.name() == "probe.py"  # what top shows
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert "got SIGTERM" in out and process.returncode == 7

    process = client(warm, 0, "--wait")
    seen = json.loads(process.stdout.readline())
    process.kill()  # as the launcher kills a job's process group
    process.wait()
    assert psutil.wait_procs([psutil.Process(seen["pid"])], timeout=10)[1] == []


def test_peak_memory_is_reported_and_a_small_limit_starts_cold(warm):
    ran(client(warm, 0))
    seen, _, code = ran(client(warm, 0, mem_bytes=8 << 30))
    assert code == 0 and seen["parent"] == server_pid(warm)
    assert json.loads((warm / "usage.json").read_text())["peak_rss_kb"] > 100_000  # torch is in it
    (warm / "usage.json").unlink()
    process = client(warm, 0, mem_bytes=2 << 30)  # under 4x the server's data: cold, the client execs the script
    seen, _, code = ran(process)
    assert code == 0 and seen["pid"] == process.pid
    assert not (warm / "usage.json").exists()


def test_a_folder_others_can_open_is_refused(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    (runtime / "dlokit-warm").mkdir(parents=True)
    (runtime / "dlokit-warm").chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with pytest.raises(PermissionError):
        warm_start.runtime_dir()


def test_the_server_key_follows_what_torch_reads_as_it_imports():
    base = {"PATH": "/bin", "PYTHONPATH": "/a"}
    key = warm_start.server_key(sys.executable, base)
    assert warm_start.server_key(sys.executable, {**base, "RANK": "1", "OMP_NUM_THREADS": "3",
                                                  "TORCHINDUCTOR_CACHE_DIR": "/c"}) == key
    assert warm_start.server_key(sys.executable, {**base, "TORCH_LOGS": "dynamo"}) != key
    assert warm_start.server_key(sys.executable, {**base, "PYTHONPATH": "/b"}) != key
    assert warm_start.server_key(sys.executable, {**base, "CXX": "/no/g++"}) != key  # inductor's config reads it


FORKSERVER = """
import multiprocessing, os, sys
import psutil
from dlokit.in_job import warm_start

def where():
    return [p.pid for p in psutil.Process().parents()][:2]

if __name__ == "__main__":
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch"])
    from multiprocessing import forkserver
    with warm_start.forkserver_from_server():
        forkserver.ensure_running()
    with context.Pool(1) as pool:
        print(pool.apply(where), os.getpid(), flush=True)
"""


def test_a_ranks_forkserver_is_forked_by_the_server_and_its_workers_run(warm):
    (warm / "scripts" / "forkserver.py").write_text(FORKSERVER)
    ran(client(warm, 0))  # the server is up
    command = warm_start.command(sys.executable, ["../scripts/forkserver.py"])
    out = subprocess.run(command, cwd=warm / "work", env={**os.environ, "SUBMITIT_EXECUTOR": "local"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    parents, rank = out.stdout.split("]")
    forkserver, above = json.loads(parents + "]")
    assert above == server_pid(warm) and int(rank) != forkserver  # the worker's forkserver came from the server


def test_a_server_whose_imports_load_the_cuda_driver_serves_nobody(warm, monkeypatch):
    # torch loads libcuda.so lazily, at its first CUDA call; were an import to load it, a forked script could not use
    # CUDA. A library named like the driver, loaded as the server's interpreter starts, stands in for such an import.
    driver = warm / "lib" / "libcuda.so.1"
    driver.parent.mkdir()
    driver.write_bytes(Path("/lib/x86_64-linux-gnu/libz.so.1").read_bytes())
    (warm / "lib" / "sitecustomize.py").write_text(f"import ctypes\nctypes.CDLL({str(driver)!r})\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(warm / "lib"), os.environ.get("PYTHONPATH", "")]))
    for _ in range(2):  # the first client starts the server, which ends; the next one does not wait for it
        process = client(warm, 0)
        seen, _, code = ran(process)
        assert code == 0 and seen["pid"] == process.pid  # cold: the client became the script
    notes = list(Path(os.environ["XDG_RUNTIME_DIR"], "dlokit-warm").glob("*.cold"))
    assert len(notes) == 1 and str(driver) in notes[0].read_text()
    assert server_pid(warm) is None


def test_the_cuda_driver_is_found_among_a_process_maps():
    line = "7f00-7f10 r-xp 00000000 fd:01 123 {}"
    assert warm_start.cuda_driver_loaded("\n".join([line.format("/usr/lib/x86_64-linux-gnu/libcudart.so.12"),
                                                    line.format("/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"),
                                                    "7f20-7f30 rw-p 00000000 00:00 0"])) \
        == "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"
    assert warm_start.cuda_driver_loaded(line.format("/opt/torch/lib/libtorch_cuda.so")) == ""
    assert warm_start.cuda_driver_loaded() == ""  # this test's process never touched CUDA
