"""LoRA: `targets.py` (what each model family adapts, the settings' checks), `adapters.py` (the adapter module,
where it goes), `footprint.py` (counts and memory), `folders.py` (PEFT folders, adapter checkpoints, the export),
`base_check.py` (the base's fingerprint, checked on resume)."""
