"""Proposing: a tree's paths cut where the completion must end."""



def test_a_single_line_tree_stops_at_its_paths_first_newline(engine, monkeypatch):
    """A single-line completion ends at its first newline, so no tree node may follow one; a
    multi-line completion's paths run on across lines."""
    from specdec.decode import proposing

    offered, grow = [], proposing.grow_tree

    def recording(tree, paths, *args, **kwargs):
        offered.extend(paths)
        return grow(tree, paths, *args, **kwargs)

    monkeypatch.setattr(proposing, "grow_tree", recording)
    newline = engine.prompts.newline_ids
    prefix = "value = compute(alpha, beta)\nresult = value + 1\n" * 3 + "value = comp"

    def crossing():
        return [p for p in offered if any(t in newline for t in p.tokens[:-1])]

    engine.complete(prefix, "", mode="single", strategy="hybrid", max_tokens=8)
    assert offered and not crossing()
    offered.clear()
    engine.complete(prefix, "", mode="multi", strategy="hybrid", max_tokens=32)
    assert crossing()  # the repeat runs past the line's end: the cut above had work to do


def test_no_tree_node_lies_past_the_token_limit(engine, monkeypatch):
    from specdec.decode.generation import Generation

    steps, propose = [], Generation.propose

    def recording(self, *args, **kwargs):
        tree = propose(self, *args, **kwargs)
        steps.append((self.max_tokens - len(self.generated), max(tree.depths)))
        return tree

    monkeypatch.setattr(Generation, "propose", recording)
    prefix = "value = compute(alpha, beta)\nresult = value + 1\n" * 3 + "value = comp"
    for limit in (3, 5, 9):
        engine.complete(prefix, "", mode="multi", strategy="hybrid", max_tokens=limit)
    assert steps and all(depth <= left for left, depth in steps)
    assert any(depth == left for left, depth in steps)  # the repeat is long: the limit did cut
