"""The modules train_classifier.py, compile_bench.py and read_bench.py share: options, data, storage formats,
instrumentation, checkpoints, and train_classifier.py's harness (its records, validation, LR finder, report). No TP
asks you to edit them (docs/architecture.md lists each one's role), and none of them imports a file you edit.
Both your scripts (in tp_scripts/) and the reference (tp_scripts/solutions/) import them as this package,
installed with the kit under the name `common`."""
