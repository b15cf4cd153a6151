"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

`python -m sglang.launch_server <argv>` for the stand-in: parses the real flags, resolves, prints the real
startup log and serves HTTP (see sglang/srt/standin_engine.py for the env knobs and failure modes).
"""

import os
import signal
import sys
import time
import warnings


def run_fail_text() -> None:
    """STANDIN_MODE=fail_text: replay a recorded log verbatim, then exit like it did."""
    path = os.environ.get("STANDIN_FAIL_LOG", "")
    with open(path, "rb") as fh:
        data = fh.read()
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    code = int(os.environ.get("STANDIN_EXIT", "1"))
    if code < 0 or code > 128:
        os.kill(os.getpid(), -code if code < 0 else code - 128)
        time.sleep(5)
    sys.exit(code)


def run_server(server_args) -> int:
    from sglang.srt.standin_engine import launch_server

    # 0.5.23 resolves here, in the main process: a resolution error is a plain traceback, exit 1.
    # The seed era (0.5.10) already resolved inside prepare_server_args and has no resolve_once.
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
    return launch_server(server_args)


def main() -> None:
    mode = os.environ.get("STANDIN_MODE", "ok")
    if mode == "sigkill_empty":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "fail_text":
        run_fail_text()
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(sys.argv[1:])
    sys.exit(run_server(server_args))


if __name__ == "__main__":
    main()
