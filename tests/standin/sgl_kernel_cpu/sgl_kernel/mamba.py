"""STAND-IN for `sgl_kernel.mamba`: none of the Mamba kernels is provided; calling one raises."""

from __future__ import annotations

from sgl_kernel import _missing

chunk_gated_delta_rule_cpu = _missing("chunk_gated_delta_rule_cpu")
causal_conv1d_fn_cpu = _missing("causal_conv1d_fn_cpu")
causal_conv1d_update_cpu = _missing("causal_conv1d_update_cpu")
