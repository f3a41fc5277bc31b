"""Engine: the models, the prefix cache, the prompt cache and the scheduler behind one request path.

    handle = engine.submit(CompletionOptions(prefix, suffix, ...))   # any thread
    handle.result() | await handle.wait() | async for delta in handle.deltas()
    engine.complete(prefix, suffix, **options) == engine.submit(CompletionOptions(...)).result()

The server and the evaluation use only this class's public methods and what specdec exports.
"""

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import specdec_kernels as kernels
from specdec.decode.budget import VerifyCost
from specdec.decode.decoding import DecodeContext
from specdec.decode.drafting import head_step_millis
from specdec.decode.generation import Generation
from specdec.decode.handle import CompletionHandle
from specdec.decode.history import SuggestionHistory
from specdec.decode.policy import PolicyBook
from specdec.decode.prefetch import PrefetchCounts, Prefetcher
from specdec.decode.prompt_cache import PromptCache
from specdec.decode.scheduler import Scheduler
from specdec.models import model_cache
from specdec.models.adapted import adapted_draft_for, check_fits
from specdec.models.dense_draft import is_dense_draft, load_dense_draft
from specdec.models.eagle import is_eagle3, load_eagle3
from specdec.models.gguf_checkpoint import is_gguf
from specdec.models.loader import load_model
from specdec.models.quantize import loads_packed, quantize_target
from specdec.options import CompletionOptions, OptionsError
from specdec.prompt.fim import PromptBuilder
from specdec.prompt.fim_formats import FimFormatError, order
from specdec.prompt.retrieval import ContextSettings, StableContext

log = logging.getLogger("specdec.engine")


_SAMPLE_CODE = Path(__file__).resolve().parent / "decode" / "scheduler.py"  # real code tokens to time forwards with


def default_model_dir() -> Path:
    """The embedded default models: target/ and draft/, each a complete HF-layout directory."""
    return Path(__file__).resolve().parent / "default_models"


def model_label(path) -> str:
    """"embedded/<name>" for a shipped default, else the directory as given (reports and cards
    carry no machine paths for the defaults)."""
    resolved = Path(path).resolve()
    return f"embedded/{resolved.name}" if resolved.parent == default_model_dir().resolve() else str(path)


@dataclass(frozen=True)
class EngineMetrics:
    """A snapshot of what the engine holds, for /metrics, /health and evaluators."""

    queue_depth: int  # waiting + prefilling + decoding requests
    expert_load: list  # [MoE layer][expert] tokens routed since the last reset
    prompt_cache_entries: int
    prompt_cache_bytes: int
    documents: int  # documents with their own acceptance statistics
    recent: tuple  # FinishedRecords of the latest finished requests, oldest first
    prefetch: PrefetchCounts  # prefetch jobs by outcome and their CPU time


# The longest prompt: a document's first request prefills all of it. On flask and starlette a real
# 0.5B model completes as well from 1,024 tokens as from 1,536 (bench/results/context_quality_*).
PROMPT_TOKENS = 1024


# The draft argument that asks for no draft: neither an adapted one nor a pulled target's head.
NO_DRAFT = "none"


def asks_no_draft(draft) -> bool:
    return draft is not None and str(draft) == NO_DRAFT


def _pulled_head(target) -> Path | None:
    head = model_cache.installed_head(target) if target is not None else None
    if head is not None:
        log.info("drafting with the EAGLE-3 head exported for this target: %s", head)
    return head


def _decoding(name: str) -> property:
    """An engine attribute that lives in its DecodeContext, where every generation reads it."""
    return property(lambda self: getattr(self.decode, name), lambda self, value: setattr(self.decode, name, value),
                    doc=f"DecodeContext.{name}")


class Engine:
    target, draft, head, index = _decoding("target"), _decoding("draft"), _decoding("head"), _decoding("index")
    prompts, prompt_cache, prefetcher = _decoding("prompts"), _decoding("prompt_cache"), _decoding("prefetcher")
    history, contexts, policies = _decoding("history"), _decoding("contexts"), _decoding("policies")
    adaptive, max_tree_nodes, draft_depth = _decoding("adaptive"), _decoding("max_tree_nodes"), _decoding("draft_depth")
    verify_cost, draft_min_prob = _decoding("verify_cost"), _decoding("draft_min_prob")

    def __init__(self, target, draft=None, index=None, *, head=None, max_tree_nodes: int = 64, draft_depth: int = 8,
                 adaptive: bool = True, warm_up: bool = True, fim_mode: str | None = None, prefetch: bool = True,
                 context: ContextSettings | None = None):
        """adaptive=False always speculates with every node the sources offer (up to the budget):
        for tests and measurements of speculation itself; True decides by measured speed.
        warm_up=False defers the hardware measurements to an explicit warm_up() call, or to the
        first request that speculates.
        fim_mode overrides the order named in the target's config.json (psm, spm, suffix_first).
        prefetch=False never computes the request after an accept ahead (specdec.decode.prefetch); it
        runs only on a started engine (a server), whose loop has idle time to give it.
        context: how much repository context a prompt gets from the index (specdec.prompt.retrieval)."""
        if target.tokenizer is None:
            raise ValueError(f"{target.path}: the target model has no tokenizer.json")
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError("draft and target vocabularies differ; the draft must share the target's tokenizer")
        kernels.configure_from_environment()
        if head is not None:  # never reset: another engine on the same target may have a head
            target.capture_layers = head.config.capture_layers(target.config.num_layers)
        fim_mode = fim_mode or target.config.raw.get("fim_mode")  # None: the family's default order
        positions = target.config.max_position_embeddings  # room to generate is kept after the prompt
        prompts = PromptBuilder(target.tokenizer, fim_mode, min(PROMPT_TOKENS, max(positions // 2, positions - 256)))
        self.decode = DecodeContext(
            target, draft, head, prompts, PromptCache(), Prefetcher(enabled=prefetch), SuggestionHistory(),
            StableContext(context), PolicyBook(), index, adaptive, max_tree_nodes, draft_depth)
        self.scheduler = Scheduler(self)
        self.lock = threading.Lock()  # one inline driver of the scheduler at a time
        if warm_up:
            self.warm_up()

    @classmethod
    def from_pretrained(cls, target=None, draft=None, index=None, repo=None, target_model=None, quantize: str = "none",
                        **kwargs) -> "Engine":
        """None: the embedded defaults (target and draft model; the EAGLE-3 head in
        default_models/head is the other choice, as draft=) and no index; index: an Index or its directory.
        With no draft given, a draft adapted to `repo` (or to the saved index) is used when it fits
        the target (specdec.models.adapted), else the EAGLE-3 head exported for a pulled target
        (model_cache.installed_head); a draft given that was adapted against another target is refused.
        draft="none": no draft at all.
        target_model: the target already loaded from `target` (an expert-parallel shard).
        quantize "int8": the target's weights in int8 (specdec.models.quantize; CPU, fp32 models); "blocks"
        (and "auto" for a GGUF target): its weights packed in 8-bit blocks (specdec.models.packed)."""
        defaults = default_model_dir()
        target_dir = target or defaults / "target"
        index_dir = index if isinstance(index, (str, Path)) else None
        no_draft = asks_no_draft(draft)
        if no_draft:
            draft = None
        else:
            draft = draft or adapted_draft_for(target_dir, repo=repo, index_dir=index_dir) or _pulled_head(target)
        if draft is not None:
            check_fits(draft, target_dir)
        target_model = target_model or load_model(target_dir, packed=loads_packed(target, quantize))
        if quantize != "none":
            quantize_target(target_model, quantize)
        draft_path = draft or (defaults / "draft" if target is None and not no_draft else None)
        if draft_path and is_eagle3(draft_path):  # recognised from its config
            kwargs["head"] = load_eagle3(draft_path, target_model, target_model.dtype)
            draft_path = None
        if draft_path and is_dense_draft(draft_path):  # reads the target's embedding, as a head does
            draft_model = load_dense_draft(draft_path, target_model)
        else:  # a GGUF draft (the family's smaller model) is packed by the same rule as the target
            draft_model = load_model(draft_path, packed=is_gguf(Path(draft_path)) and loads_packed(draft_path, quantize)) \
                if draft_path else None
        if index is not None and not hasattr(index, "propose"):
            from prefixcache import Index

            index = Index.load(index)
        return cls(target_model, draft_model, index, **kwargs)

    # hardware-sized budgets, measured once --------------------------------------------------

    def warm_up(self) -> None:
        """Measure the target's verify cost by tree size and the draft's relative cost (about 30
        forwards), before any request is timed. Idempotent."""
        if self.verify_cost is not None and self.draft_min_prob is not None:
            return
        sample = self.prompts.encode(_SAMPLE_CODE.read_text(encoding="utf-8"))
        if self.verify_cost is None:
            self.verify_cost = VerifyCost.measure(self.target, sample_ids=sample)
            log.info("verify cost (ms) by tree size: %s", json.dumps(self.verify_costs()))
        if self.draft_min_prob is None:
            ratio = 0.1
            if self.draft is not None:
                ratio = VerifyCost.measure(self.draft, repeats=3, sample_ids=sample)(1) / self.verify_cost(1)
            elif self.head is not None:
                ratio = head_step_millis(self.head) / self.verify_cost(1)
            # Draft while a token's acceptance chance pays for its draft forward.
            self.draft_min_prob = min(0.5, max(0.05, ratio))

    def verify_costs(self) -> dict:
        """{tree tokens: ms} of one target forward, as measured on this device."""
        self.warm_up()
        return {n: round(ms, 3) for n, ms in zip(self.verify_cost.sizes, self.verify_cost.millis, strict=True)}

    def set_limits(self, max_batch: int | None = None, max_queue: int | None = None) -> None:
        """Requests stepped together, and requests allowed to wait (beyond it: QueueFull)."""
        if max_batch is not None:
            self.scheduler.max_batch = max_batch
        if max_queue is not None:
            self.scheduler.max_queue = max_queue

    def set_prefetch(self, enabled: bool) -> None:
        """Turn prefetching after an accept on or off (off drops the jobs queued)."""
        self.prefetcher.set_enabled(enabled)

    def attach_index(self, index) -> None:
        """Serve from `index` (a prefixcache.Index, or None for none) from the next step on: its
        files are read for retrieval first, off the scheduler's thread when called off it."""
        if index is not None:
            index.prepare_retrieval()
        self.index = index

    def remember_suggestion(self, document: str | None, prefix: str, text: str) -> None:
        """Keep `text`, shown after `prefix` in `document`, as a suggestion the user may type
        along (what a served hybrid completion does by itself; an evaluator replays its own)."""
        self.history.record(document, prefix, text)

    def set_context(self, settings: ContextSettings) -> None:
        """How much repository context later prompts get; the contexts chosen so far are dropped."""
        self.contexts = StableContext(settings)

    # completing ---------------------------------------------------------------------------

    def submit(self, options: CompletionOptions) -> CompletionHandle:
        """Queue one completion; raises QueueFull when too many wait, OptionsError for a FIM
        order the target's family lacks."""
        if options.fim_mode is not None:
            try:
                order(self.prompts.format, options.fim_mode)
            except FimFormatError as err:
                raise OptionsError(str(err), "fim_mode") from None
        if options.sources.speculates:  # plain decoding reads no measured cost
            self.warm_up()
        if options.path is not None and self.index is not None:
            options = options.with_changes(path=self.index.relative(options.path))
        generation = Generation(self.decode, options)
        self.prefetcher.dropping_for(options)  # the user did something else than accept
        self.scheduler.submit(generation)
        return CompletionHandle(self, generation)

    def prefetch_after(self, generation: Generation) -> None:
        """(scheduler thread) Prefetch after a finished completion, when it was answered and asked
        for it; only a started engine (a server) has the idle time to."""
        text = generation.current_text()
        if self.scheduler.thread is not None and not generation.background \
                and self.prefetcher.wants(generation.options, text, generation.stop_reason):
            self.prefetch(generation.options, text)

    def prefetch(self, options: CompletionOptions, suggestion: str) -> None:
        """Queue, as background work, the requests that accepting `suggestion` (returned for
        `options`) would send: the scheduler runs them while no request waits (specdec.decode.prefetch)."""
        self.prefetcher.queue(options, suggestion, self._background_generation)

    def _background_generation(self, options: CompletionOptions) -> Generation:
        generation = Generation(self.decode, options)
        generation.background = True
        return generation

    def complete(self, prefix: str, suffix: str = "", **options):
        """One completion, start to end: submit(CompletionOptions(prefix, suffix, **options)).result()."""
        return self.submit(CompletionOptions(prefix, suffix, **options)).result()

    def start(self) -> None:
        """Step requests on a background thread (a server); without it, result() steps inline."""
        self.warm_up()
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()

    # what callers may read ----------------------------------------------------------------

    def queue_depth(self) -> int:
        """Requests waiting, prefilling or decoding: all that /health needs, with no tensor or
        prompt-cache work, so that it answers at once whatever the scheduler is doing."""
        return self.scheduler.queue_depth()

    def runtime(self) -> dict:
        """How the target runs here (for /health): its weights' form, the thread count that
        torch and the native step share, and the packed matrices' kernel."""
        import torch

        from specdec_kernels import cpu_decode

        target = self.target
        weights = "packed 8-bit blocks" if target.packed else str(target.dtype).removeprefix("torch.")
        drafter = "eagle3 head" if self.head is not None else "draft model" if self.draft is not None else None
        return {"weights": weights, "native_step": target.native_step is not None,
                "threads": torch.get_num_threads(),
                "packed_kernel": cpu_decode.qkernel() if target.packed else None, "draft": drafter}

    def metrics(self) -> EngineMetrics:
        entries, nbytes = self.prompt_cache.nbytes()
        return EngineMetrics(self.scheduler.queue_depth(), self.target.expert_load().tolist(), entries, nbytes,
                             len(self.policies), tuple(self.scheduler.recent), self.prefetcher.snapshot())

    def forget_history(self, document: str | None) -> None:
        """Drop a document's suggestion history (an evaluator's clean start)."""
        self.history.forget(document)

    def reset_expert_load(self) -> None:
        self.target.reset_expert_load()

    def prompt_for(self, prefix: str, suffix: str = "", path: str | None = None, fim_mode: str | None = None):
        """The Prompt (ids, healing, truncation) this engine would prefill for a cursor without
        repository context (`path` names the file; only a prompt with context carries it)."""
        return self.prompts.build(prefix, suffix, fim_mode=fim_mode)

    @property
    def tokenizer(self):
        return self.prompts.tokenizer

    @property
    def stop_token_ids(self) -> frozenset:
        """Tokens that end a completion (end of text and the FIM and file separators)."""
        return frozenset(self.prompts.stop_ids)
