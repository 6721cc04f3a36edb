"""The checkers' module under test, loaded from its file: your copy beside check_tp.py / check_cp.py, or with
--solution the reference in solutions/ (the same name in two folders, so not through the import path)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_module(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, Path(folder) / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module
