"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

`python -m vllm.entrypoints.openai.api_server ARGS`: parses with the real flag table (unknown flags and bad
values fail as argparse does, exit 2), prints vLLM 0.33.0's startup log and serves /health, /v1/models and
/v1/chat/completions. Failures and knobs: see vllm/standin_engine.py.
"""

import os
import signal
import sys
import time
import warnings


def run_fail_text() -> None:
    """STANDIN_MODE=fail_text: replay a recorded log verbatim, then exit like it did."""
    with open(os.environ.get("STANDIN_FAIL_LOG", ""), "rb") as fh:
        sys.stdout.buffer.write(fh.read())
    sys.stdout.flush()
    sys.exit(int(os.environ.get("STANDIN_EXIT", "1")))


def main() -> None:
    from vllm.standin_log import SITE

    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "sigkill_empty":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(5)
    if mode == "fail_text":
        run_fail_text()
    # api_server.py:51 (0.33.0), printed by the warnings module on stderr, naming the real file
    warnings.warn_explicit(
        "The `python -m vllm.entrypoints.openai.api_server` command is deprecated "
        "and may be removed in a future release. Please use `vllm server` instead.",
        DeprecationWarning, SITE + "entrypoints/openai/api_server.py", 51, module="__main__")
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.standin_engine import run_server
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args()
    validate_parsed_serve_args(args)
    sys.exit(run_server(parser, args))


if __name__ == "__main__":
    warnings.simplefilter("default", DeprecationWarning)
    main()
