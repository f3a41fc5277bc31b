"""Admission: what a request takes when it begins.

Its prompt, built with the repository context retrieved for the cursor (retrieval.StableContext,
fim.PromptBuilder); and the longest cached prefix of that prompt (prompt_cache.PromptCache), with
the side caches its strategy drafts with: the draft model's cache, or the target's features and
the EAGLE-3 head's cache. A request that drafts nothing keeps the entry's side caches aside
(`spare`), so that the document's next drafting request finds them.
"""

from dataclasses import dataclass

from specdec.decode.decoding import DecodeContext
from specdec.decode.drafting import DraftRunner, EagleRunner
from specdec.decode.prompt_cache import SideCaches
from specdec.options import CompletionOptions
from specdec.prompt.fim import Prompt

ROOM_AFTER_PROMPT = 80  # cache rows made beyond the prompt and the token limit (a tree's nodes)


@dataclass
class Taken:
    """The caches a request begins with, and how many prompt tokens they already hold."""

    cache: object  # the target's KVCache
    reuse: int
    draft: DraftRunner | None = None
    eagle: EagleRunner | None = None
    spare: SideCaches | None = None


def build_prompt(ctx: DecodeContext, options: CompletionOptions) -> tuple[Prompt, float]:
    """(the prompt, milliseconds spent retrieving its context)."""
    extra, reserve, repo, path, retrieval_ms = options.extra, 0, None, None, 0.0
    settings = ctx.contexts.settings
    if options.context == "auto" and ctx.index is not None and settings.tokens:
        retrieved, retrieval_ms = ctx.contexts.chunks(ctx.index, options)
        extra, reserve = tuple(options.extra) + retrieved, settings.tokens
        if settings.repository_format:
            repo, path = ctx.index.name, ctx.index.relative(options.path) if options.path else None
    prompt = ctx.prompts.build(options.prefix, options.suffix, extra, path, reserve=reserve,
                               fim_mode=options.fim_mode, repo=repo)
    return prompt, retrieval_ms


def needs_features(ctx: DecodeContext, options: CompletionOptions) -> bool:
    """Whether the request drafts with an EAGLE-3 head, which reads the target's features."""
    return options.sources.draft and ctx.head is not None


def take_caches(ctx: DecodeContext, options: CompletionOptions, ids: list[int]) -> Taken:
    """The prompt cache's longest match for `ids` (all but the last id may be reused), or new caches."""
    entry, common = ctx.prompt_cache.take(ids) if options.use_prompt_cache else (None, 0)
    features = needs_features(ctx, options)
    if entry is not None:
        taken = Taken(entry.target, min(common, entry.target.length, len(ids) - 1))
        if features:  # the head needs the target's features of every reused token
            taken.reuse = min(taken.reuse, 0 if entry.features is None else len(entry.features))
        taken.cache.truncate(taken.reuse)
    else:
        taken = Taken(ctx.target.new_cache(len(ids) + options.max_tokens + ROOM_AFTER_PROMPT), 0)
    uses_draft = options.sources.draft and ctx.draft is not None
    if uses_draft:
        kept = entry is not None and entry.draft is not None
        taken.draft = DraftRunner(ctx.draft, *((entry.draft, entry.draft_tokens) if kept else ()))
    if entry is not None and not uses_draft and not features:
        taken.spare = entry.kept_to(taken.reuse)
    if features:
        kept = entry is not None and entry.features is not None
        taken.eagle = EagleRunner(ctx.head, entry.features if kept else None, entry.head if kept else None,
                                  entry.head_synced if kept else 0)
        taken.eagle.truncate(taken.reuse)
    return taken


def side_caches(draft: DraftRunner | None, eagle: EagleRunner | None, spare: SideCaches | None) -> SideCaches:
    """What a finished request keeps beside the target's cache: its own draft's and head's
    caches, else those of the entry it took without using them (spare)."""
    if spare is not None:
        return spare
    return SideCaches(draft.cache if draft else None, draft.synced if draft else [],
                      eagle.features if eagle else None, eagle.cache if eagle else None, eagle.synced if eagle else 0)
