"""scripts/install_packages.sh, which both set-ups use: uv installs when it can, pip when uv fails, and a failure of
both is an error that shows the log. A real virtual environment and a real small package (six) each time."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def install(venv: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    script = f'source "{REPO}/scripts/install_packages.sh"; install_packages "$0" "$@"'
    return subprocess.run(["bash", "-c", script, str(venv), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def imports_six(venv: Path) -> bool:
    return subprocess.run([str(venv / "bin" / "python"), "-c", "import six"]).returncode == 0


def test_uv_installs_the_packages(tmp_path):
    done = install(tmp_path / "venv", "six")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "venv" / "bin" / "uv").exists(), "uv is installed first, to do the install"
    assert "installing with pip instead" not in done.stderr
    assert imports_six(tmp_path / "venv")


def test_pip_takes_over_when_uv_fails(tmp_path):
    done = install(tmp_path / "venv", "six", env={"UV_INDEX_STRATEGY": "no-such-strategy"})
    assert done.returncode == 0, done.stderr
    assert "uv could not install the packages" in done.stderr and "installing with pip instead" in done.stderr
    assert imports_six(tmp_path / "venv")


def test_a_package_nobody_has_fails_with_the_log(tmp_path):
    done = install(tmp_path / "venv", "dlokit-no-such-package-anywhere==0.0.1")
    assert done.returncode == 1
    assert "pip install failed" in done.stderr and "dlokit-no-such-package-anywhere" in done.stderr
    assert not imports_six(tmp_path / "venv")
