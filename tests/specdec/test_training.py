"""The training recipe on tiny inputs: corpus filters and split, deduplication, samples, packing,
and a resumed run that equals an uninterrupted one."""

import io
import random
import tarfile
import zipfile

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from specdec.training.corpus import EVAL_REPOSITORIES, SourceFile, build_corpus, is_code_file, read_archive
from specdec.training.dedup import drop_duplicates
from specdec.training.packed import PackedBatches, write_packed
from specdec.training.samples import Mix, SampleMaker
from specdec.training.tokenizer import EOT, FILE_SEP, FIM_MIDDLE
from specdec.training.train import TrainSettings, build_model, train
from tests.helpers import STDLIB, tiny_config

CODE = "\n".join(f"def function_{i}(value):\n    total = value * {i}\n    return total + {i}\n" for i in range(30))


def _file(path, text):
    return SourceFile(path, text)


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return Tokenizer.from_file(str(tiny_models[0] / "tokenizer.json"))


def test_archives_are_read_and_filtered(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/core.py", CODE)
        z.writestr("pkg/_vendor/requests/api.py", CODE)
        z.writestr("pkg/data.json", "{}")
    sdist = tmp_path / "other-2.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        data = CODE.encode()
        info = tarfile.TarInfo("other-2.0/src/other/mod.py")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    assert [p for p, _ in read_archive(wheel)] == ["pkg/_vendor/requests/api.py", "pkg/core.py"]
    assert [p for p, _ in read_archive(sdist)] == ["src/other/mod.py"]
    assert is_code_file("pkg/core.py", CODE.encode())
    assert not is_code_file("pkg/_vendor/requests/api.py", CODE.encode())
    for repo in EVAL_REPOSITORIES:
        assert not is_code_file(f"site/{repo}/app.py", CODE.encode())
    assert not is_code_file("pkg/table.py", b"x = [" + b"1, " * 500 + b"]\n")


def test_split_is_by_package_and_duplicates_leave_training():
    other = CODE.replace("total", "result")
    sources = {"alpha": [("alpha/a.py", CODE.encode()), ("alpha/b.py", other.encode())],
               "beta": [("beta/copy_of_a.py", CODE.encode())],
               "gamma-lib": [("gamma/near.py", (CODE + "\n# one more line\n").encode())]}
    train, held = build_corpus(sources, held_out=("beta",))
    assert {f.package for f in held} == {"beta"} and {f.package for f in train} <= {"alpha", "gamma_lib"}
    assert [f.path for f in train] == ["alpha/alpha/b.py"]  # a.py is beta's twin, near.py a near-twin


def test_near_duplicates_are_dropped_and_different_files_kept():
    files = [_file("a", CODE), _file("b", CODE.replace("value", "x", 1)), _file("c", CODE.replace("total", "t"))]
    assert [f.path for f in drop_duplicates(files)] == ["a", "c"]


def _maker(tokenizer, mix: Mix | None = None):
    texts = {"pkg/a.py": CODE, "pkg/b.py": CODE.replace("function", "helper"),
             "pkg/c.py": (STDLIB / "textwrap.py").read_text(), "pkg/d.py": (STDLIB / "shlex.py").read_text()}
    return SampleMaker([_file(p, t) for p, t in texts.items()], tokenizer, seed=3, mix=mix or Mix())


def test_batches_are_a_pure_function_of_the_step(tokenizer):
    a, b = _maker(tokenizer), _maker(tokenizer)
    assert a.batch(5, 2, 64) == b.batch(5, 2, 64)
    assert a.batch(5, 2, 64) != a.batch(6, 2, 64)
    assert all(len(row) == 65 for row in a.batch(7, 3, 64))


def test_context_holds_the_middle_when_the_answer_chunk_is_drawn(tokenizer):
    maker = _maker(tokenizer, Mix(plain=0.0, psm=0.0, context=1.0, answer_chunk=1.0))
    sep, middle = tokenizer.token_to_id(FILE_SEP), tokenizer.token_to_id(FIM_MIDDLE)
    hits = 0
    for seed in range(20):
        ids = maker.sample(random.Random(seed))
        assert sep in ids and middle in ids
        context = tokenizer.decode(ids[: ids.index(middle)], skip_special_tokens=False)
        completion = tokenizer.decode(ids[ids.index(middle) + 1 :], skip_special_tokens=True)
        last_line = completion.rstrip("\n").split("\n")[-1].strip()
        hits += bool(last_line) and last_line in context
    assert hits >= 15


def test_recall_samples_repeat_earlier_lines_in_another_order(tokenizer):
    maker = _maker(tokenizer, Mix(recall=1.0))
    repeated = fresh = 0
    for seed in range(20):
        ids = maker.sample(random.Random(seed))
        lines = tokenizer.decode(ids, skip_special_tokens=True).split("\n")[1:-1]  # after the path line
        seen = set()
        for line in lines:
            repeated, fresh = repeated + (line in seen), fresh + (line not in seen)
            seen.add(line)
        assert len(set(lines)) < len(lines)  # every sample repeats something
    assert repeated > 100 and fresh > repeated  # fresh lines too, so copying is not always right


def test_synthetic_samples_are_a_random_run_repeated(tokenizer):
    maker = _maker(tokenizer, Mix(synthetic=1.0))
    special = set(maker.special.values())
    for seed in range(10):
        ids = maker.sample(random.Random(seed))
        body = ids[:-1]
        period = next(p for p in range(1, len(body)) if body[p:] == body[:-p])
        assert len(body) // period >= 2 and len(body) % period == 0  # two copies or more
        assert ids[-1] == maker.special[EOT] and not special & set(body)


def test_packed_rows_round_trip(tokenizer, tmp_path):
    path = write_packed(_maker(tokenizer), tokens=2000, seq_len=32, out=tmp_path / "packed.npz", block_rows=8)
    rows = np.load(path)["rows"]
    assert rows.dtype == np.uint16 and rows.shape[1] == 33 and rows.size >= 2000
    batches = PackedBatches(path, seed=1)
    first = batches.batch(0, 4, 32)
    assert first.shape == (4, 33) and np.array_equal(first, PackedBatches(path, seed=1).batch(0, 4, 32))
    with pytest.raises(ValueError, match="--seq-len 32"):
        batches.batch(0, 4, 64)


def _tiny_run(tokenizer, run_dir, steps=None):
    raw = tiny_config("moe", tokenizer.get_vocab_size(), 0)
    model = build_model(raw, seed=0)
    maker = _maker(tokenizer)
    settings = TrainSettings(tokens=6 * 2 * 32, batch_size=2, seq_len=32, warmup_steps=2, max_steps=steps)
    done = train(model, lambda step: maker.batch(step, 2, 32), settings, run_dir)
    return model, done


def test_a_resumed_run_equals_an_uninterrupted_one(tokenizer, tmp_path):
    torch.manual_seed(0)
    whole, done = _tiny_run(tokenizer, tmp_path / "whole")
    assert done
    stopped, done = _tiny_run(tokenizer, tmp_path / "split", steps=3)  # interrupted half way
    assert not done and (tmp_path / "split" / "checkpoint.pt").exists()
    assert not torch.allclose(stopped.state_dict()["lm_head.weight"], whole.state_dict()["lm_head.weight"])
    resumed, done = _tiny_run(tokenizer, tmp_path / "split")
    assert done
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_recipe_trains_distils_and_exports_from_a_packed_corpus(tokenizer, tmp_path):
    """The path a machine without network takes (python -m specdec.training ... --data), with a
    tiny step count: target, then the draft distilled from it, then export and load."""
    from specdec import Engine, load_model
    from specdec.models.eagle import load_eagle3
    from specdec.training.__main__ import main

    packed = write_packed(_maker(tokenizer), tokens=600, seq_len=32, out=tmp_path / "packed.npz", block_rows=8)
    common = ["--runs", str(tmp_path / "runs"), "--data", str(packed), "--batch-size", "2", "--seq-len", "32",
              "--threads", "1", "--tokens", "128"]
    assert main(["target", *common]) == 0
    assert main(["draft", *common]) == 0
    assert main(["head", *common]) == 0
    assert main(["export", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "models")]) == 0
    target, draft = load_model(tmp_path / "models" / "target"), load_model(tmp_path / "models" / "draft")
    # A head continued from an exported one keeps its weights and draft vocabulary (lr 0: no update).
    assert main(["head", *common, "--name", "head_again", "--init-from", str(tmp_path / "models" / "head"),
                 "--lr", "0"]) == 0
    exported = load_eagle3(tmp_path / "models" / "head", target).state_dict()
    continued = torch.load(tmp_path / "runs" / "head_again" / "checkpoint.pt", weights_only=False)["model"]
    for name in ("fc.weight", "lm_head.weight", "d2t"):
        assert torch.equal(continued[name].to(exported[name].dtype), exported[name]), name
    assert target.config.is_moe and target.config.num_experts >= 8 and not draft.config.is_moe
    result = Engine(target, draft).complete("def add(a, b):\n    return ", max_tokens=3, strategy="hybrid")
    assert len(result.tokens) <= 3


def test_an_eagle3_head_learns_the_targets_features_and_loads_in_the_published_layout(tokenizer, tmp_path):
    from specdec import Engine
    from specdec.models.eagle import is_eagle3, load_eagle3
    from specdec.training.eagle3 import build_head, head_config, head_loss, head_loss_fn, save_head

    torch.manual_seed(0)
    target = build_model(tiny_config("moe", tokenizer.get_vocab_size(), 0), seed=1).eval()
    raw = head_config(target.config)
    head = build_head(raw, target)
    maker = _maker(tokenizer)
    batch = torch.as_tensor(maker.batch(0, 2, 48))
    before = head_loss(head, target, batch)[0].item()
    settings = TrainSettings(tokens=40 * 2 * 48, batch_size=2, seq_len=48, lr=3e-3, warmup_steps=2)
    assert train(head, lambda step: maker.batch(step % 4, 2, 48), settings, tmp_path / "head_run",
                 loss_fn=head_loss_fn(target))
    assert head_loss(head, target, batch)[0].item() < 0.8 * before
    save_head(head, raw, tmp_path / "head")
    assert is_eagle3(tmp_path / "head")
    loaded = load_eagle3(tmp_path / "head", target)
    assert torch.equal(loaded.d2t, torch.zeros_like(loaded.d2t))
    target_dir = tmp_path / "target"
    from specdec.training.__main__ import export_model

    export_model(target, tiny_config("moe", tokenizer.get_vocab_size(), 0), tokenizer, target_dir)
    engine = Engine.from_pretrained(target_dir, tmp_path / "head", adaptive=False)
    prompt = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return "
    reference = engine.complete(prompt, "", strategy="ar", max_tokens=8, mode="multi").tokens
    assert engine.complete(prompt, "", strategy="draft", max_tokens=8, mode="multi").tokens == reference


def test_recipe_trains_an_eagle3_head_and_exports_it(tokenizer, tmp_path):
    from specdec.models.eagle import is_eagle3
    from specdec.training.__main__ import main

    packed = write_packed(_maker(tokenizer), tokens=600, seq_len=32, out=tmp_path / "packed.npz", block_rows=8)
    common = ["--runs", str(tmp_path / "runs"), "--data", str(packed), "--batch-size", "2", "--seq-len", "32",
              "--threads", "1", "--tokens", "128"]
    for stage in ("target", "draft", "head"):
        assert main([stage, *common]) == 0
    assert main(["export", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "models")]) == 0
    assert is_eagle3(tmp_path / "models" / "head")


def test_a_head_drafts_over_the_most_frequent_tokens(tokenizer):
    from specdec.training.eagle3 import build_head, draft_vocabulary, head_config, head_loss

    target = build_model(tiny_config("moe", tokenizer.get_vocab_size(), 0), seed=1).eval()
    head = build_head(head_config(target.config, draft_vocab=64), target)
    maker = _maker(tokenizer)
    rows = [maker.batch(step, 4, 32) for step in range(10)]
    draft_vocabulary(head, rows)
    kept = head.to_target(torch.arange(64))
    counts = torch.bincount(torch.as_tensor(rows).flatten(), minlength=target.config.vocab_size)
    assert len(set(kept.tolist())) == 64 and counts[kept].min() >= counts.sort(descending=True).values[63]
    loss, (step0, step1) = head_loss(head, target, torch.as_tensor(rows[0]))
    assert torch.isfinite(loss) and 0 <= float(step0) <= 1 and 0 <= float(step1) <= 1


def test_the_fair_copier_sees_only_the_models_window():
    from specdec.training.evaluate import PREFIX_CHARS, _naive_copy_in_window

    far = "    value = compute(far)\n"
    assert _naive_copy_in_window(far + "x = 1\n" + "    valu") == "e = compute(far)"
    beyond = (far + "x = 1\n" * PREFIX_CHARS + "    valu")[-PREFIX_CHARS:]
    assert _naive_copy_in_window(beyond) is None


def test_a_token_budget_below_one_is_refused_with_a_message(tmp_path, capsys):
    from specdec.training.__main__ import main

    for budget in ("0", "-5"):
        with pytest.raises(SystemExit) as stopped:
            main(["head", "--tokens", budget, "--runs", str(tmp_path / "runs")])
        assert stopped.value.code == 2
        assert "--tokens must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "head").exists()


def test_a_tokenizer_without_the_fim_tokens_gets_plain_rows_without_missing_ids(tokenizer):
    """Another family's tokenizer (no Qwen FIM or file separator tokens): rows of plain code
    whose every id is the tokenizer's own."""
    class OtherFamily:
        missing = {FIM_MIDDLE, FILE_SEP, "<|fim_prefix|>", "<|fim_suffix|>"}

        def token_to_id(self, token):
            return None if token in self.missing else tokenizer.token_to_id(token)

        def encode(self, text):
            return tokenizer.encode(text)

    files = [SourceFile(f"pkg/mod{i}.py", (STDLIB / "json" / "decoder.py").read_text()) for i in range(4)]
    other = SampleMaker(files, OtherFamily(), seed=3)
    fim = {tokenizer.token_to_id(t) for t in OtherFamily.missing}
    rows = other.batch(0, 6, 128)
    assert all(isinstance(i, int) for row in rows for i in row)
    assert not fim & {i for row in rows for i in row}
    assert not other.fim and SampleMaker(files, tokenizer, seed=3).fim
