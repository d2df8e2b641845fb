"""Check rendered ``vllm serve`` arguments with the installed vLLM's own CLI parser.

pdx renders the engines' command lines; a flag or a kv-transfer-config key that vLLM no longer
accepts (``kv_rank`` in 0.32, for instance) only shows up when a pod starts. Running the same
words through the ``serve`` subcommand's parser and building vLLM's ``EngineArgs`` catches that
in a unit test, without the model, the hub or an engine.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

__all__ = ["VllmArgsError", "parse_serve_args"]


class VllmArgsError(ValueError):
    """vLLM's parser rejected the arguments; the message is what vLLM printed."""


def parse_serve_args(argv: list[str]) -> tuple[Any, Any]:
    """Parse the words after ``vllm serve`` (model first) into ``(EngineArgs, KVTransferConfig)``.

    Raises VllmArgsError when vLLM rejects them. The KVTransferConfig is the object vLLM built
    from ``--kv-transfer-config`` while parsing (None when the flag is absent).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = ServeSubcommand()
    parser = FlexibleArgumentParser(prog="vllm")  # type: ignore[no-untyped-call]
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed), contextlib.redirect_stdout(printed):
            args = parser.parse_args(["serve", *argv])
            serve.validate(args)
    except SystemExit as exc:
        raise VllmArgsError(printed.getvalue().strip() or f"vllm exited with {exc.code}") from None
    # What `vllm serve` itself does before building the engine: the positional model wins.
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except (TypeError, ValueError) as exc:
        raise VllmArgsError(str(exc)) from exc
    return engine_args, engine_args.kv_transfer_config
