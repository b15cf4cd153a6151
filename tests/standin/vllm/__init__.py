"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

A stdlib-only imitation of the `vllm` package as seen from outside: `python -m vllm.entrypoints.openai.api_server`,
`vllm.__version__`, and the serve argument parser (`vllm.entrypoints.common.cli_args.make_arg_parser`) that the
deployer's probe builds. The imitated version: env STANDIN_VLLM_VERSION, default "0.33.0".
"""

import os

__version__ = os.environ.get("STANDIN_VLLM_VERSION", "0.33.0")

__all__ = ["__version__"]
