"""neuron_qwen3: torchtitan recipes that train Qwen3 three ways (v5, native, nki_moe).

Used as `--module neuron_qwen3 --config <function>`; the functions are in config_registry.py.
"""
