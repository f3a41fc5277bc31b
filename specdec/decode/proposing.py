"""Proposing: the token tree of one decoding step, and what the step's outcome teaches.

A request's strategy (options.Strategy) names its sources: the repository's prefix cache, the
document's earlier suggestions and the text's own repeats, n-grams, and the draft model or
EAGLE-3 head. The lookups propose at every step; the adaptive engine runs the draft when the
document's measured speeds say it pays (policy.SpeculationPolicy), and not while the text runs
along an earlier suggestion. Each source's paths (drafting.DraftPath) are merged into one
TokenTree, cut to what the stop rules and the token limit leave usable and grown within the
verify budget (budget.grow_tree).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from specdec.decode.budget import grow_tree, min_useful_prob
from specdec.decode.decoding import DecodeContext
from specdec.decode.drafting import DraftPath, branch_paths, cut_after, head, history_paths, ngram_paths, trie_paths
from specdec.decode.history import SELF_SEARCH_CHARS
from specdec.decode.policy import PolicyPair, learn_acceptance, learn_draft, speed_key
from specdec.decode.tree import TokenTree

if TYPE_CHECKING:
    from specdec.decode.generation import Generation

# Forced speculation (Engine(adaptive=False), eval --always-speculate) measures the sources'
# acceptance apart from the hardware, so the draft's floor there is a confidence, not the
# measured ratio of draft to target cost that the adaptive engine drafts by.
FORCED_DRAFT_FLOOR = 0.05


def propose(g: Generation, ctx: DecodeContext, riding: int = 0) -> TokenTree:
    """The token tree of g's next step: the sources' paths, grown within the verify budget.
    riding: tokens of other requests in this step's forward (see grow_tree); a batched step's
    speeds are learned apart from a lone one's, since its trees cost the step less."""
    tree = TokenTree(g.committed[-1])
    g.catch_up_ms = 0.0
    g.riding = riding
    g.speed_key = speed_key(g.options.strategy, riding > 0)
    if not g.options.sources.speculates:  # plain decoding (`ar`): no source to ask
        return tree
    g.draft_chosen, g.drafting = _draft_decision(g, ctx)
    g.stats.draft_steps += int(g.drafting)
    paths = _paths(g, ctx, g.policies.document.acceptance, draft=g.drafting)
    if not paths:
        return tree
    if g.healing_pending:
        paths = [p for p in paths if p.tokens and g.healing.allows(p.tokens[0])]
    if g.output.rules.single_line:  # its line's end ends the completion: nodes after it could never be used
        paths = [cut_after(p, ctx.prompts.newline_ids) for p in paths]
    left = g.max_tokens - len(g.generated)  # nor can nodes past the token limit
    paths = [head(p, left) for p in paths]
    grow_tree(tree, paths, ctx.verify_cost, ctx.max_tree_nodes, force=not ctx.adaptive, riding=riding)
    g.stats.tree_nodes += len(tree)
    return tree


def _draft_decision(g: Generation, ctx: DecodeContext) -> tuple[bool, bool]:
    """(whether the policy chose, whether the draft model or head drafts this step).

    The lookups (trie, history, n-grams) propose at every step: they cost a small part of a
    step, and grow_tree prices each of their nodes by its learned acceptance and the measured
    verify cost, so a step where they find nothing is a plain step. What the measured speeds
    decide is the draft, whose forwards cost a real share of a step: steps with it against
    steps without it, per document. Gating the lookups on measured speeds too let a stretch of
    code where they found nothing (speculating steps that cost a plain step and their lookups)
    turn them off for the stretches after it, where they would have paid (docs/findings.md)."""
    drafts = g.options.sources.draft and (g.eagle is not None or g.draft is not None)
    if not drafts:
        return False, False
    if not ctx.adaptive:
        return False, True
    if _along_a_suggestion(g, ctx):  # the suggestion's rest is the tree (see _paths)
        return False, False
    return True, g.policies.document.should_speculate(g.speed_key)


def _along_a_suggestion(g: Generation, ctx: DecodeContext) -> bool:
    """Whether the text runs along an earlier suggestion of this document: then the suggestion's
    rest is accepted whole lines at a time, and a draft's chain there mostly proposes it again."""
    return g.options.sources.history and ctx.history.typing_along(g.options.document, g.options.prefix, g.text)


def _history_paths(g: Generation, ctx: DecodeContext, acceptance, lengths=None) -> list[DraftPath]:
    """The suggestion history's paths after the text so far (tail lengths: MATCH_LENGTHS, or
    `lengths`, which bench/policy_sim.py logs one at a time), the text itself searched
    SELF_SEARCH_CHARS back and the text after the cursor as far forward."""
    # Only what the search reads: a prefix is often the whole file, copied at every step.
    searched = g.options.prefix[-SELF_SEARCH_CHARS - 1 :] + g.text
    return history_paths(ctx.history, g.options.document, searched, ctx.prompts.encode, g.healing_left, acceptance,
                         lengths=lengths, after=g.options.suffix[:SELF_SEARCH_CHARS])


def _paths(g: Generation, ctx: DecodeContext, acceptance, draft: bool = True) -> list[DraftPath]:
    """draft False: the draft model or head sits this step out. Along a suggestion the target
    made itself, the suggestion's rest is the tree, accepted whole lines at a time; a draft's
    chain there costs its forwards at every step and mostly proposes the same tokens again."""
    sources, paths = g.options.sources, []
    healed = g.healing_left
    if sources.trie:
        paths += trie_paths(ctx.index, g.options.prefix + g.text, g.options.path, ctx.prompts.encode, healed,
                            acceptance)
    if sources.history:
        paths += _history_paths(g, ctx, acceptance)
    if sources.ngram:
        paths += ngram_paths(g.committed, acceptance)
    drafter = g.eagle if g.eagle is not None else g.draft
    if drafter is not None and draft:
        if drafter is g.draft:
            _catch_up(g)
        # Another draft forward must pay for itself and for its token's place in the tree, both:
        # the chain's chance times a target step must beat the two costs together. A token whose
        # forward is already paid needs only to pay for its node (drafting.extends). When
        # speculation is forced, costs are no concern, and the draft drafts while it is not guessing.
        floor, keep = FORCED_DRAFT_FLOOR, None
        if ctx.adaptive:
            node = min_useful_prob(ctx.verify_cost, g.riding)
            floor = (ctx.draft_min_prob + node) / acceptance.draft_scale
            keep = node / acceptance.draft_scale
        first = g.healing.allowed if g.healing_pending else None
        tokens, probs = drafter.chain(g.committed, ctx.draft_depth, min(0.95, floor), first, ctx.prompts.stop_ids,
                                      keep_prob=keep)
        scale = acceptance.draft_scale
        paths.append(DraftPath("draft", tokens, [p * scale for p in probs]))
        paths += [DraftPath("draft", branch, [p * scale for p in branch_probs])
                  for branch, branch_probs in branch_paths(tokens, probs, drafter.alternatives)]
    return paths


def _catch_up(g: Generation) -> None:
    """Bring the draft's cache up to the prompt before it first drafts. After a cold prompt
    that is a prefill through the draft, paid once and kept by the prompt cache for the next
    keystrokes: its time is not this step's, whose speed the policy learns (the scheduler
    takes catch_up_ms out of the proposing time). Tokens generated since are fed by the
    chain itself, as before, and counted."""
    started = time.perf_counter()
    g.draft.catch_up(g.prompt.ids)
    g.catch_up_ms = (time.perf_counter() - started) * 1000


def learn(policies: PolicyPair, tree: TokenTree, accepted_nodes) -> None:
    """Each source's proposed and accepted depth in this step's tree, and the draft's calibration,
    into the document's policy and the prior."""
    depth_by_source, accepted = {}, {}
    for node in range(1, len(tree)):
        s = tree.sources[node]
        depth_by_source[s] = max(depth_by_source.get(s, 0), tree.depths[node])
    for node in accepted_nodes:
        accepted[tree.sources[node]] = accepted.get(tree.sources[node], 0) + 1
    for source, depth in depth_by_source.items():
        learn_acceptance(policies, source, depth, accepted.get(source, 0))
    predicted = sum(tree.probs[n] for n in range(1, len(tree)) if tree.sources[n] == "draft")
    learn_draft(policies, predicted, accepted.get("draft", 0))
