"""Mixed GPU types (issue 38): a ``--gpus`` spec of several groups, and the planner's roles by GPU type."""

from __future__ import annotations

import pytest

from grpo_launch.errors import ProbeError
from grpo_launch.machines.topology import parse_gpu_spec


@pytest.mark.parametrize(
    ("spec", "types"),
    [
        ("8xH100-80GB+8xH20-96GB", ["H100-80GB"] * 1 + ["H20"]),
        ("2x8xH100-80GB+1x8xL40S-48GB", ["H100-80GB", "H100-80GB", "L40S"]),
        ("4xH100+2xH100", ["H100-80GB", "H100-80GB"]),
        ("8xH100-80GB+8xH20-96GB+8xL40S-48GB", ["H100-80GB", "H20", "L40S"]),
    ],
)
def test_a_spec_of_several_groups_gives_the_hosts_of_each_group_in_order(spec, types):
    t = parse_gpu_spec(spec)
    assert [h.gpus[0].name for h in t.hosts] == types
    assert [h.name for h in t.hosts] == [f"node{i}" for i in range(len(types))]
    assert all(len({g.visible_id for g in h.gpus}) == len(h.gpus) for h in t.hosts)
    assert "+" in t.describe() or len(set(types)) == 1


def test_uneven_groups_of_one_type_keep_their_sizes():
    t = parse_gpu_spec("4xH100+2xH100")
    assert t.gpus_per_host == (4, 2)
    assert t.gpu_types == ("H100-80GB",)


def test_an_unknown_model_in_a_group_still_needs_its_peak_and_bandwidth():
    t = parse_gpu_spec("8xH100-80GB+4xFOO-48GB@150TF@0.9TBs")
    assert t.spec_of("FOO").bf16_tflops == 150.0
    assert t.planning_gpu_name == "FOO"  # the slowest, as every GPU steps together in one colocated group
    assert parse_gpu_spec("8xH100-80GB+4xFOO-48GB").time_missing is not None


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("8xH100-80GB+8xFOO", "group 2 ('8xFOO')"),
        ("8xH100-80GB+", "group 2 (empty)"),
        ("8xH100-80GB+cpu", "group 2 ('cpu')"),
        ("8xNOPE+8xH100", "group 1 ('8xNOPE')"),
        ("8xH100+2x2x2xH20", "group 2 ('2x2x2xH20')"),
    ],
)
def test_a_bad_group_is_named(spec, names):
    with pytest.raises(ProbeError) as err:
        parse_gpu_spec(spec)
    assert names in err.value.message
