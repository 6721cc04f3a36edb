"""The training scripts' modules inside a test process.

The shared modules are packages: tp_scripts.common (the classifier's) and tp_scripts.llm.common (train_llm's).
A script imports its own as `common`, the name both share, so a script is loaded with `load_script`: for that
import only, `common` and `common.<module>` are the very module objects of its family's package."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def common(name: str, *, llm: bool = False):
    """A shared module: common(\"train_options\"), common(\"model\", llm=True)."""
    return importlib.import_module(f"tp_scripts{'.llm' if llm else ''}.common.{name}")


def load_script(path: str | Path, name: str | None = None):
    """A script imported from its file, as `python path` sees its imports: its folder first on sys.path (the TP
    modules beside it), and `common` its family's package."""
    path = Path(path).resolve()
    package = ".".join((path.parent / "common").resolve().relative_to(REPO).parts)
    modules = ["common", *(f"common.{m.stem}" for m in sorted((path.parent / "common").glob("*.py")) if m.stem != "__init__")]
    saved = {key: sys.modules.get(key) for key in modules}
    sys.path.insert(0, str(path.parent))  # first: parallelize.py imports the TP modules beside it
    try:
        for key in modules:
            sys.modules[key] = importlib.import_module(package + key.removeprefix("common"))
        spec = importlib.util.spec_from_file_location(name or path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
