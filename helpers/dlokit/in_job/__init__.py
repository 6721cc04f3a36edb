"""What runs inside a job, beside the training script: who this rank is (rank), the DLOKIT_* contract and the
exit codes (jobenv), the run record (runrecord), step clocks and memory (measure), energy (energy), the task
submitit runs (task), shared folders' permissions (shared_folders). Light to import: a job pays for each one."""
