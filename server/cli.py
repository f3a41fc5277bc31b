"""`specdec serve` and `specdec lsp`: the server's subcommands, "specdec.commands" entry points.

Kept light: nothing heavy is imported until the command runs, because the CLI loads every
registered command to build its parser.
"""

from dataclasses import dataclass
from pathlib import Path


def _model_arguments(parser, repo_help: str) -> None:
    from specdec import add_model_arguments

    parser.add_argument("--repo", type=Path, help=repo_help)
    add_model_arguments(parser)
    parser.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                        help="do not compute, while idle, the completion that would follow accepting the one "
                             "just returned (requests may also say so: \"prefetch\": false)")
    parser.add_argument("--context-tokens", type=_tokens, metavar="N",
                        help="prompt tokens kept for code retrieved from the repository (default: "
                             f"{_default_context_tokens()}; 0: none, requests may also say \"context\": \"none\")")


def _tokens(text: str) -> int:
    import argparse

    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of tokens, 0 or more")
    return int(text)


def _default_context_tokens() -> int:
    from specdec import ContextSettings

    return ContextSettings.tokens


@dataclass(frozen=True)
class ServeCommand:
    name: str = "serve"
    help: str = "run the completion server"

    def add_arguments(self, parser) -> None:
        _model_arguments(parser, "repository to index into the prefix cache (in the background)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8012)
        parser.add_argument("--api-key", default=None, help="or SPECDEC_API_KEY; protects all but /health")
        from specdec import add_expert_parallel_arguments

        add_expert_parallel_arguments(parser)

    def run(self, args) -> int:
        from specdec_server.main import load_engine, serve
        from specdec_server.settings import Settings

        settings = Settings.from_env(host=args.host, port=args.port, api_key=args.api_key, repo=args.repo,
                                     target=args.target, draft=args.draft, fim_mode=args.fim_mode,
                                     quantize=args.quantize, prefetch=args.prefetch,
                                     context_tokens=args.context_tokens)
        if not args.expert_parallel:
            # A FIM order the target's family lacks, or a quantization its device lacks, is
            # refused here, as a CLI error, not in startup.
            early = args.fim_mode or args.quantize not in ("none", "auto")
            return serve(settings, load_engine(settings) if early else None)
        return _serve_expert_parallel(settings, args.expert_stats)


SERVE = ServeCommand()


def _serve_expert_parallel(settings, statistics) -> None:
    """Rank 0 serves; the other ranks follow its steps. When the group fails, the server stops
    itself (as on Ctrl-C) and exits 1 with the reason."""
    import logging
    import os
    import signal

    from specdec import default_model_dir, run_expert_parallel
    from specdec_server.main import load_engine, serve

    def stop_server(reason: str) -> None:
        logging.getLogger("specdec.serve").error("stopping: %s", reason)
        os.kill(os.getpid(), signal.SIGINT)

    def lead(model, channel) -> int:
        channel.on_failure = stop_server
        serve(settings, load_engine(settings, model))
        return 0

    run_expert_parallel(settings.target or default_model_dir() / "target", statistics, lead)


@dataclass(frozen=True)
class LspCommand:
    name: str = "lsp"
    help: str = "run the inline-completion language server (LSP 3.18) over stdio"

    def add_arguments(self, parser) -> None:
        _model_arguments(parser, "repository to index (default: the client's workspace folder)")
        parser.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP instead of stdio")

    def run(self, args) -> int:
        import logging
        import sys

        from specdec import Engine
        from specdec_server.lsp import run
        from specdec_server.settings import context_settings

        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout carries the protocol
        if args.tcp and not args.tcp.rpartition(":")[2].isdigit():
            raise ValueError(f"--tcp {args.tcp!r}: expected HOST:PORT")
        engine = Engine.from_pretrained(args.target, args.draft, repo=args.repo, fim_mode=args.fim_mode,
                                        quantize=args.quantize, prefetch=args.prefetch,
                                        context=context_settings(args.context_tokens))
        return run(engine, args.repo, args.tcp)


LSP = LspCommand()
