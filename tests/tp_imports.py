"""The training scripts' modules inside a test process, as a job sees them.

The shared packages are installed with the kit under their own names: `common` (the classifier's,
tp_scripts/common) and `llm_kit` (the language model's, tp_scripts/llm/llm_kit). A script is loaded from its file
by the kit's one loader, dlokit.script_modules.load_script: the TP modules it imports come from its own folder."""
from __future__ import annotations

import importlib

from dlokit.script_modules import load_script  # noqa: F401 (the tests' loader)


def common(name: str, *, llm: bool = False):
    """A shared module: common(\"train_options\"), common(\"model\", llm=True)."""
    return importlib.import_module(f"{'llm_kit' if llm else 'common'}.{name}")
