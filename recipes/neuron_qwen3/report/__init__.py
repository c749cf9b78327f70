"""The run report: `run_report.py` ($OUTPUT_DIR/report/: metrics, summary, progress), `plots.py`, `flops.py` (MFU)."""
