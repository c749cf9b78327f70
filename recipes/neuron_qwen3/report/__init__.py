"""The run report: `run_report.py` ($OUTPUT_DIR/report/: metrics, summary, progress), `plots.py`, `flops.py` (MFU),
`data_read.py` (what the data gave, over the ranks), `samples.py` (SAMPLE_PROMPTS answered while it trains)."""
