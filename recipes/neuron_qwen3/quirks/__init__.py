"""Platform quirks, one module each, each naming the upstream behaviour it works around: `devices.py` (device
set-up), `cpu_adapter.py` (torchtitan on CPU), `hf_rope_fix.py` (transformers' RoPE init), `titan_compat.py`
(torchtitan name moves), `titan_logs.py` (torchtitan log lines untrue of these runs), `titan_exit_sleep.py`
(torchtitan's 2 s wait at the end of train()), `worker_exit.py` (a finished worker skips the interpreter's
finalization), `import_compile.py` (torchtitan compiles flex attention at import,
deferred in the pre-launch pass), `chat_template.py` (torchtitan's plain-Jinja compile of `{% generation %}`
templates)."""
