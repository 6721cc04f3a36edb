"""A shared module of the training scripts (their package `common/`), read from the notebook's side: the race
form reads train_options.py's parser, Day 4's memory model reads model.py's configurations.

The package is loaded from the folder given (the student's copy or the reference, whose common/ links to the
same files) under a name of its own, so its relative imports work and it never shadows a job's `common`."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def common_module(scripts_folder: str | Path, name: str):
    """`common/<name>.py` beside the scripts of `scripts_folder`, imported as a module."""
    package_dir = Path(scripts_folder).resolve() / "common"
    if not (package_dir / f"{name}.py").is_file():
        raise FileNotFoundError(f"no common/{name}.py in {scripts_folder}: is it a folder of the kit's training scripts "
                                "(tp_scripts, tp_scripts/solutions, tp_scripts/llm...)?")
    alias = f"_dlokit_common_{abs(hash(str(package_dir.resolve())))}"
    if alias not in sys.modules:
        spec = importlib.util.spec_from_file_location(alias, package_dir / "__init__.py",
                                                      submodule_search_locations=[str(package_dir)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[alias] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{alias}.{name}")
