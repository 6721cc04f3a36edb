"""The modules train_classifier.py, compile_bench.py and read_bench.py share: options, data, storage formats,
instrumentation, checkpoints. No TP asks you to edit them (docs/architecture.md lists each one's role).
Both your scripts (in tp_scripts/) and the reference (tp_scripts/solutions/, whose common/ links here) import
them as this package."""
