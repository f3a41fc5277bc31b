"""`specdec serve`: the server's subcommand, registered as a "specdec.commands" entry point.

Kept light: nothing heavy is imported until the command runs, because the CLI loads every
registered command to build its parser.
"""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServeCommand:
    name: str = "serve"
    help: str = "run the completion server"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--repo", type=Path, help="repository to index into the prefix cache (in the background)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8012)
        parser.add_argument("--api-key", default=None, help="or SPECDEC_API_KEY; protects all but /health")
        parser.add_argument("--target", type=Path, help="an HF-layout target model directory")
        parser.add_argument("--draft", type=Path, help="an HF-layout draft model directory")

    def run(self, args) -> int:
        from server.main import serve
        from server.settings import Settings

        settings = Settings.from_env(host=args.host, port=args.port, api_key=args.api_key, repo=args.repo,
                                     target=args.target, draft=args.draft)
        return serve(settings)


SERVE = ServeCommand()
