"""TRL 1.16's own GRPOConfig as the judge of a layout: built with world_size patched to the plan's process count."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping
from typing import Any
from unittest import mock

from grpo_launch.recipe import trl_schema

_OUT = tempfile.mkdtemp(prefix="grpo-oracle-")


def grpo_config(values: Mapping[str, Any], world_size: int):
    """Construct GRPOConfig from the GRPOConfig keys of ``values`` as if ``world_size`` processes ran it."""
    from trl import GRPOConfig

    kwargs = {k: v for k, v in values.items() if k in trl_schema.GRPO_CONFIG}
    # The oracle runs on a CPU machine: precision and device flags are not what is being judged here.
    kwargs.update(output_dir=_OUT, use_cpu=True, bf16=False, fp16=False, report_to="none")
    kwargs.pop("deepspeed", None)
    with (
        warnings.catch_warnings(),
        mock.patch.object(GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=world_size),
    ):
        warnings.simplefilter("ignore")
        return GRPOConfig(**kwargs)
