"""The modules train_llm.py and the Day 4 checkers share: the model, its data, the parallel layouts beside it
(parallelize.py), the meters. No TP asks you to edit them (docs/architecture.md lists each one's role).
The kit installs this package by its name (pyproject.toml), so your scripts (in tp_scripts/llm/) and the reference
(tp_scripts/llm/solutions/) both import it as `llm_kit`; it never imports a script of either folder."""
