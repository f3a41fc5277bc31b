"""DecodeContext: what a generation reads of the engine, and nothing more.

The engine owns one and hands it to every Generation (and so to proposing): the models, the
caches a request takes from and gives back to, the sources that propose tokens, and the budgets
that size a step's tree. The index and the measured budgets change while a server runs
(Engine.attach_index, Engine.warm_up, Engine.set_context); a generation reads them when it uses
them, so a change reaches the next step.
"""

from dataclasses import dataclass

from specdec.decode.policy import PolicyBook, PolicyPair


@dataclass
class DecodeContext:
    target: object  # Transformer
    draft: object | None  # a small model of the target's vocabulary, or None
    head: object | None  # an EAGLE-3 head on the target's features, or None
    prompts: object  # PromptBuilder: tokenizer, FIM format, stop and newline ids
    prompt_cache: object  # PromptCache
    prefetcher: object  # Prefetcher
    history: object  # SuggestionHistory
    contexts: object  # StableContext: repository context for prompts
    policies: PolicyBook
    index: object | None  # the prefix cache (prefixcache.Index), or None
    adaptive: bool  # False: always speculate with every node the sources offer (measurements)
    max_tree_nodes: int
    draft_depth: int
    verify_cost: object | None = None  # VerifyCost: a verify pass's cost by tree size, once measured
    draft_min_prob: float | None = None  # the draft's cost relative to the target's, once measured

    def policies_for(self, document: str | None) -> PolicyPair:
        """The document's SpeculationPolicy and the global prior; the same object twice for None."""
        return PolicyPair(self.policies.for_document(document), self.policies.prior)
