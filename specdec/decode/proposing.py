"""Proposing: the token tree of one decoding step, and what the step's outcome teaches.

A request's strategy (options.Strategy) names its sources: the repository's prefix cache, the
document's earlier suggestions and the text's own repeats, n-grams, and the draft model or
EAGLE-3 head. The adaptive engine speculates when the document's measured speeds say it pays
(policy.SpeculationPolicy), and always while the text runs along an earlier suggestion; each
source's paths (drafting.DraftPath) are merged into one TokenTree, cut to what the stop rules and
the token limit leave usable and grown within the verify budget (budget.grow_tree).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from specdec.decode.budget import grow_tree, min_useful_prob
from specdec.decode.decoding import DecodeContext
from specdec.decode.drafting import DraftPath, branch_paths, cut_after, head, history_paths, ngram_paths, trie_paths
from specdec.decode.history import MATCH_LENGTHS, SELF_SEARCH_CHARS
from specdec.decode.policy import PolicyPair, learn_acceptance, learn_draft, speed_key
from specdec.decode.tree import TokenTree

if TYPE_CHECKING:
    from specdec.decode.generation import Generation

REPEAT_SEARCH_CHARS = 4_000  # of the text searched for a long repeat on a plain step (see _long_repeats)

# Forced speculation (Engine(adaptive=False), eval --always-speculate) measures the sources'
# acceptance apart from the hardware, so the draft's floor there is a confidence, not the
# measured ratio of draft to target cost that the adaptive engine drafts by.
FORCED_DRAFT_FLOOR = 0.05


def propose(g: Generation, ctx: DecodeContext, riding: int = 0) -> TokenTree:
    """The token tree of g's next step: the sources' paths, grown within the verify budget.
    riding: tokens of other requests in this step's forward (see grow_tree); a batched step's
    speeds are learned apart from a lone one's, since its trees cost the step less."""
    sources = g.options.sources
    tree = TokenTree(g.committed[-1])
    g.catch_up_ms = 0.0
    g.riding = riding
    g.speed_key = speed_key(g.options.strategy, riding > 0)
    document_policy = g.policies.document
    policy_says = not ctx.adaptive or document_policy.should_speculate(g.speed_key)
    drafts = g.eagle is not None or g.draft is not None
    along = ctx.adaptive and (drafts or not policy_says) and _along_a_suggestion(g, ctx)
    g.speculating = sources.speculates and (policy_says or along)
    drafting = g.speculating and drafts and not along  # along a suggestion the draft sits out (see _paths)
    g.stats.draft_steps += int(drafting)
    paths = _paths(g, ctx, document_policy.acceptance, draft=drafting) if g.speculating else _long_repeats(g, ctx)
    g.repeat_only = not g.speculating and bool(paths)
    if not g.speculating and not paths:
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


def _along_a_suggestion(g: Generation, ctx: DecodeContext) -> bool:
    """Speculate, whatever the measured speeds say, while the text runs along an earlier
    suggestion of this document: then whole lines are accepted at once, which periodic
    exploration alone would find too late."""
    return g.options.sources.history and ctx.history.typing_along(g.options.document, g.options.prefix, g.text)


def _long_repeats(g: Generation, ctx: DecodeContext) -> list[DraftPath]:
    """On a step the policy decodes plainly, a strategy with the history source still offers
    what followed a long tail match (MATCH_LENGTHS[:2], 48 or 24 characters) in the document's
    suggestions or earlier in its own text: a string search costs microseconds, where the trie
    and the draft cost a good part of a step. It catches a completion that repeats what it or the
    file already wrote (a run of `str, str, ...` to the token limit), which the measured speeds
    would leave plain; the tree is still cut to what its priced acceptance pays for. Shorter
    tails matched too often to pay. The text is searched only REPEAT_SEARCH_CHARS back: the
    search runs at every plain step, and the repeats it finds lie within a few hundred characters."""
    if not g.options.sources.history:
        return []
    return _history_paths(g, ctx, g.policies.document.acceptance, MATCH_LENGTHS[:2], REPEAT_SEARCH_CHARS)


def _history_paths(g: Generation, ctx: DecodeContext, acceptance, lengths=None,
                   search_chars: int = SELF_SEARCH_CHARS) -> list[DraftPath]:
    """The suggestion history's paths after the text so far (tail lengths: MATCH_LENGTHS),
    the text itself searched `search_chars` back and the text after the cursor as far forward."""
    # Only what the search reads: a prefix is often the whole file, copied at every step.
    searched = g.options.prefix[-search_chars - 1 :] + g.text
    return history_paths(ctx.history, g.options.document, searched, ctx.prompts.encode, g.healing_left, acceptance,
                         lengths=lengths, after=g.options.suffix[:search_chars])


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
