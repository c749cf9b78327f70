"""The ranks' config comparison (recipes/neuron_qwen3/run/same_config.py): what is compared and which field is named.

Across two real nodes, under Slurm and with plain variables: tests/test_slurm_nodes.py.
Run: .venv/bin/python -m pytest tests/test_same_config.py -q
"""

from torchtitan.config import ConfigManager

from neuron_qwen3.run import same_config


def parsed(*flags, config="native_qwen3_smoke"):
    return same_config.fields(
        ConfigManager().parse_args(["--module", "neuron_qwen3", "--config", config, *flags]).to_dict()
    )


def test_two_processes_parsing_the_same_flags_agree():
    """Function reprs carry their address (`<function normal_ at 0x7f...>`), which differs between processes."""
    mine = parsed("--training.steps", "8")
    assert not any(" at 0x" in value for value in mine.values())
    assert same_config.first_difference(mine, parsed("--training.steps", "8")) is None


def test_the_first_differing_field_is_named():
    assert (
        same_config.first_difference(parsed("--training.steps", "8"), parsed("--training.steps", "9"))
        == "training.steps"
    )
    # VARIANT picks another config function: its report section names the variant first
    assert same_config.first_difference(parsed(), parsed(config="nki_moe_qwen3_smoke")) == "report.variant"
    layers = parsed("--training.steps", "8")
    assert layers["model_spec.model.layers[0].attention.n_heads"] == "4"  # list items by index


def test_this_nodes_own_paths_and_launch_time_may_differ_and_shared_ones_may_not():
    here = parsed(
        "--dump_folder=/local/a",
        "--checkpoint.folder=/fsx/run/checkpoint",
        "--report.launched_at=1.5",
        "--dataloader.source=/local/a/data.jsonl",
    )
    there = parsed(
        "--dump_folder=/local/b",
        "--checkpoint.folder=/fsx/run/checkpoint",
        "--report.launched_at=2.5",
        "--dataloader.source=/local/b/data.jsonl",
    )
    assert "dump_folder" not in here and same_config.first_difference(here, there) is None
    other = parsed("--dump_folder=/local/b", "--checkpoint.folder=/fsx/other/checkpoint")
    assert same_config.first_difference(here, other) == "checkpoint.folder"


def test_a_field_only_one_side_has_is_a_difference():
    assert same_config.first_difference({"a": "1"}, {"a": "1", "b": "2"}) == "b"
    assert same_config.first_difference({"a": "1", "b": "2"}, {"a": "1"}) == "b"
