"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

A stdlib-only imitation of the `sglang` package as seen from outside: `python -m sglang.launch_server`,
`sglang.__version__` and `sglang.srt.server_args`. The era is chosen by env STANDIN_SGLANG_VERSION.
"""

from sglang.version import __version__

__all__ = ["__version__"]
