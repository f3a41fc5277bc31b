"""Server settings: command-line flags first, then SPECDEC_* environment variables, then defaults."""

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Settings:
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8012
    api_key: str | None = None  # when set, every endpoint but /health needs "Authorization: Bearer KEY"
    repo: Path | None = None
    target: Path | None = None
    draft: Path | None = None
    fim_mode: str | None = None  # psm, spm or suffix_first; None: the target's config, else its family's default
    quantize: str = "auto"  # specdec.models.quantize.QUANTIZATIONS: "auto" packs a GGUF target in 8-bit blocks
    index_roots: list = field(default_factory=list)  # where /v1/index may read; default: the repo
    model_name: str = "specdec-default"
    max_body_bytes: int = 2 << 20
    max_prompt_chars: int = 200_000
    max_suffix_chars: int = 100_000
    max_extra_chunks: int = 64
    max_new_tokens: int = 512
    max_queue: int = 64
    max_batch: int = 16
    max_index_file_bytes: int = 2 << 20
    prefetch: bool = True  # compute the request after an accept while idle (specdec.decode.prefetch)
    context_tokens: int | None = None  # prompt tokens for retrieved repository code; None: the engine's default

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        env = {}
        if os.environ.get("SPECDEC_API_KEY"):
            env["api_key"] = os.environ["SPECDEC_API_KEY"]
        for name, kind in (("max_queue", int), ("max_new_tokens", int), ("max_body_bytes", int)):
            value = os.environ.get(f"SPECDEC_{name.upper()}")
            if value:
                env[name] = kind(value)
        env.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**env)
        if not settings.index_roots and settings.repo is not None:
            settings.index_roots = [Path(settings.repo).resolve()]
        return settings


def context_settings(tokens: int | None):
    """The engine's repository-context settings with `tokens` for its budget (None: the defaults)."""
    from specdec import ContextSettings

    return ContextSettings() if tokens is None else ContextSettings(tokens=tokens)
