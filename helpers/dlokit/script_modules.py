"""The training scripts' code, read from outside a job's script: one way for the notebook's side, the checkers and
the tests.

The two families' shared packages are installed with the kit under their own names (pyproject.toml): `common`
(tp_scripts/common, the classifier's) and `llm_kit` (tp_scripts/llm/llm_kit, the language model's). A module of
theirs is an import, from any folder. A script or a student's module has one name in two folders (yours, and the
reference in solutions/), so it is loaded from its file (`load_script`)."""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

FAMILIES = {"common": "tp_scripts/common", "llm_kit": "tp_scripts/llm/llm_kit"}


def shared_package(scripts_folder: str | Path) -> str:
    """The shared package of a folder of the kit's scripts (yours, the reference, or a copy of either)."""
    return "llm_kit" if (Path(scripts_folder) / "train_llm.py").is_file() else "common"


def common_module(scripts_folder: str | Path, name: str):
    """`<package>.<name>` of the scripts of `scripts_folder`: the race form reads train_options.py's parser, Day 4's
    memory model model.py's configurations."""
    package = shared_package(scripts_folder)
    if importlib.util.find_spec(f"{package}.{name}") is None:
        raise FileNotFoundError(f"no module {name} in {package} ({FAMILIES[package]}), the shared package of the "
                                f"scripts in {scripts_folder}")
    return importlib.import_module(f"{package}.{name}")


def load_script(path: str | Path, name: str | None = None):
    """The script (or student's module) in file `path`, as `python path` would run its imports: the modules it
    imports from its own folder (your TP files beside yours, the reference's beside the reference) are loaded from
    that folder first, each under its own name. The script runs under `name` (its file's stem by default); every
    module is registered in sys.modules, as an import would (dataclasses and pickling look a module up by name)."""
    path = Path(path).resolve()
    for sibling in _siblings(path):
        loaded = sys.modules.get(sibling.stem)
        if loaded is None or Path(getattr(loaded, "__file__", "") or "").resolve() != sibling:
            load_script(sibling)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[spec.name]
        raise
    return module


def script_files(path: str | Path) -> list[Path]:
    """The files of its own folder a job of script `path` runs: the script, the modules beside it that it imports,
    and theirs (a student's TP files; the shared packages are the kit's). A file that does not parse is listed, its
    imports are not: the compile check before submission names its error."""
    files = [Path(path).resolve()]
    for file in files:  # grows as it goes: each file's siblings are read in turn
        try:
            files += [sibling for sibling in _siblings(file) if sibling not in files]
        except SyntaxError:
            continue
    return files


def script_digests(path: str | Path) -> dict[str, str]:
    """{file name: sha256 of its content} of script_files(path): what a job's card keeps of the code it ran."""
    return {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in script_files(path)}


def _siblings(path: Path) -> list[Path]:
    """The files beside `path` that it imports (`import optim_setup`, `from lr_range_test import ...`)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    files = [path.parent / f"{name}.py" for name in dict.fromkeys(names) if "." not in name]
    return [file for file in files if file.is_file() and file != path]
