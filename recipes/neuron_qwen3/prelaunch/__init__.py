"""Before launch, run by the launcher in children: `preflight.py` (the pre-launch pass), `model_folder.py` (its
model-folder checks), `checkpoints.py` (broken and unfinished checkpoints), `selftest.py` (a new trn2's self-test)."""
