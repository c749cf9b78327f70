"""LoRA: `adapters.py` (settings, the adapter module, where it goes), `footprint.py` (counts and memory),
`folders.py` (PEFT folders, adapter checkpoints, the export)."""
