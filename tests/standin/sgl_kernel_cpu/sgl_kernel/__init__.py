"""STAND-IN for `sgl_kernel` (see ../README.md): the CPU bookkeeping helper real SGLang's CPU engine needs to serve
a Llama model, in plain torch; every other helper it may import raises NotImplementedError when called."""

from __future__ import annotations

from typing import Any, NoReturn

import torch

__version__ = "0.0.0+deployer-standin"
STANDIN = True


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Row req_pool_indices[i] of req_to_token gets, at [start_offset[i], end_offset[i]), the next
    end-start entries of out_cache_loc (requests laid out one after the other)."""
    del pool_len  # the row length; req_to_token's shape already says it
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[taken:taken + n].to(req_to_token.dtype)
        taken += max(n, 0)


def _missing(name: str) -> Any:
    def helper(*_args: object, **_kwargs: object) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel stand-in: {name} is not provided (CPU bookkeeping only)")
    helper.__name__ = name
    return helper


copy_all_layer_kv_cache_cpu = _missing("copy_all_layer_kv_cache_cpu")
rotate_input_ids_cpu = _missing("rotate_input_ids_cpu")
fill_accept_out_cache_loc_cpu = _missing("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _missing("fill_bonus_tokens_cpu")
assign_draft_cache_locs_contiguous_cpu = _missing("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _missing("assign_extend_cache_locs_cpu")
build_draft_decode_metadata_cpu = _missing("build_draft_decode_metadata_cpu")
build_tree_kernel_efficient_cpu = _missing("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _missing("verify_tree_greedy_cpu")
