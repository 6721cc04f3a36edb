"""tests/preloaded.py starts a script warm (dlokit.in_job.warm_start) as `python script.py` would: same arguments,
folder, environment, sys.path, output, exit code and thread count; a timeout ends it and what it started."""
import json
import subprocess
import sys

import preloaded
import psutil
import pytest

SHOW = """
import json, os, sys
ending = sys.argv[1]
threads = __import__("torch").get_num_threads() if ending == "return" else None  # a fresh torch import: 3 s of CPU
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "mark": os.environ.get("PRELOADED_MARK"),
                  "path": sys.path, "threads": threads, "main": __name__}))
print("to stderr", file=sys.stderr)
if ending == "code":
    sys.exit(3)
if ending == "message":
    sys.exit("show.py: error: a message")
if ending == "raise":
    raise ValueError("raised here")
if ending == "os-exit":
    sys.stdout.flush()
    os._exit(5)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "scripts" / "show.py"
    path.parent.mkdir()
    path.write_text(SHOW)
    return path


@pytest.mark.parametrize("ending, code", [("return", 0), ("code", 3), ("message", 1), ("raise", 1), ("os-exit", 5)])
def test_a_preloaded_start_is_a_fresh_start(script, tmp_path, ending, code):
    command = [sys.executable, "-u", str(script), ending, "a b"]
    env = {"PATH": "/usr/bin:/bin", "PRELOADED_MARK": "seen", "OMP_NUM_THREADS": "1"}
    fresh = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    forked = preloaded.run(command, env=env, cwd=tmp_path, timeout=120)
    assert preloaded.script_argv(command) == [str(script), ending, "a b"]
    assert forked.returncode == fresh.returncode == code, forked.stderr
    assert json.loads(forked.stdout.splitlines()[0]) == json.loads(fresh.stdout.splitlines()[0])
    assert forked.stdout == fresh.stdout
    first, last = fresh.stderr.splitlines()[0], fresh.stderr.splitlines()[-1]
    assert forked.stderr.splitlines()[0] == first and forked.stderr.splitlines()[-1] == last
    assert ("Traceback" in forked.stderr) == (ending == "raise")


def test_a_timeout_ends_the_script_and_what_it_started(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      "print(child.pid, flush=True)\n"
                      "time.sleep(600)\n")
    (tmp_path / "nothing.py").write_text("")
    preloaded.run([sys.executable, str(tmp_path / "nothing.py")], cwd=tmp_path, timeout=120)  # the server is up
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        preloaded.run([sys.executable, str(script)], cwd=tmp_path, timeout=5)
    child = int(stopped.value.output.split()[0])
    try:
        _, alive = psutil.wait_procs([psutil.Process(child)], timeout=10)
    except psutil.NoSuchProcess:
        alive = []
    assert not alive, f"process {child}, started by the script, outlived the timeout"


def test_other_commands_start_as_plain_subprocesses(tmp_path):
    assert preloaded.script_argv([sys.executable, "-c", "print(1)"]) is None
    assert preloaded.script_argv(["torchrun", "--standalone", "x.py"]) is None
    done = preloaded.run([sys.executable, "-c", "print('plain')"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and done.stdout == "plain\n"


def test_popen_refuses_what_is_not_a_script():
    with pytest.raises(ValueError, match="python script.py"):
        preloaded.popen(["torchrun", "--standalone", "x.py"])
