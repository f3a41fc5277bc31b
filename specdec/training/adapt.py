"""`specdec adapt REPO`: distil the draft on one repository's code, with the target as teacher.

Only the draft changes, so what users get is unchanged (the target still verifies every token);
what changes is how often the target accepts. The draft is taught on the repository's files
in the formats the engine sends (plain, PSM and SPM rows with retrieved sibling context, the
recipe's SampleMaker) with KL on the target's logits plus cross-entropy on its argmax, and on
the target's own greedy completions at random cursors of those files (what the draft must
predict when the engine runs).

Files are split into adapt and held-out sets by a hash of their path, so the agreement figures
on the card are measured on files the draft never saw. The run is bounded by wall-clock minutes
(its learning-rate schedule is laid out over that time), shows a progress bar, and stops early
on Ctrl-C keeping what it learned. The result is written atomically: an interrupted write never
leaves half a draft where the engine looks for one.
"""

import hashlib
import json
import logging
import random
import shutil
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.engine import Engine, model_label
from specdec.models.adapted import CARD, read_card, target_fingerprint
from specdec.models.loader import load_model
from specdec.training.corpus import SourceFile
from specdec.training.evaluate import draft_agreement
from specdec.training.samples import SampleMaker
from specdec.training.train import TrainSettings, batch_loss, build_model, new_optimizer, optimizer_step

log = logging.getLogger("specdec.adapt")

HELD_OUT_EVERY = 5  # one file in five (by path hash) is kept for the figures
MIN_FILE_CHARS = 200


class AdaptError(ValueError):
    """A repository that cannot be adapted to (no code files, nothing left to hold out)."""


@dataclass(frozen=True)
class AdaptSettings:
    minutes: float = 5.0
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 2e-3  # chosen on held-out agreement at 5 minutes (docs/adapt.md)
    greedy_share: float = 0.1  # of the minutes, spent generating the target's own completions
    greedy_rows: int = 2  # of each batch, taken from those completions
    feature_share: float = 0.4  # of the minutes, spent extracting the target's features (a head with a native target)
    seed: int = 0
    progress: bool = True


def repository_files(repo: Path) -> list[SourceFile]:
    """The repository's code files that the index would read, as the recipe's SourceFiles."""
    from prefixcache import grammars
    from prefixcache.files import list_files, read_source

    skipped, files = Counter(), []
    for rel in list_files(repo):
        if grammars.language_for(rel) is None:
            continue
        text = read_source(repo, rel, skipped)
        if text is not None and len(text) >= MIN_FILE_CHARS:
            files.append(SourceFile(f"{repo.name}/{rel}", text))
    return files


def split_files(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """(adapt, held out), by a hash of each path: stable across runs and machines."""
    held = [f for f in files if _bucket(f.path) == 0]
    adapt = [f for f in files if _bucket(f.path) != 0]
    if len(files) >= 2 and not held:
        held, adapt = adapt[-1:], adapt[:-1]
    if not adapt or not held:
        raise AdaptError(f"{len(files)} code file(s) of at least {MIN_FILE_CHARS} characters: "
                         "too few to adapt on and still hold some out")
    return adapt, held


def _bucket(path: str) -> int:
    return int.from_bytes(hashlib.sha1(path.encode()).digest()[:4], "little") % HELD_OUT_EVERY


def file_hashes(files: list[SourceFile]) -> dict[str, int]:
    return {f.path: zlib.crc32(f.text.encode("utf-8", "surrogatepass")) for f in files}


def changed_since(card: dict, files: list[SourceFile]) -> int:
    """How many files were added, removed or edited since the card's adaptation."""
    before, now = card.get("file_hashes", {}), file_hashes(files)
    return sum(before.get(path) != crc for path, crc in now.items()) + len(set(before) - set(now))


def adapt(repo: Path, out: Path, target_dir: Path, draft_dir: Path, s: AdaptSettings = AdaptSettings()) -> dict:
    """Adapt the draft (a draft model or an EAGLE-3 head) in `draft_dir` to `repo`; write it to
    `out` with its card; return the card."""
    files = repository_files(repo)
    adapt_files, held_out = split_files(files)
    student = _student(Path(draft_dir), Path(target_dir), s)
    held = student.held_out(held_out)
    before = student.agreement(held, Path(draft_dir))
    log.info("%s: %d files to adapt on, %d held out; %s agreement before %.3f", repo, len(adapt_files),
             len(held_out), student.kind, before)
    started = time.time()
    greedy = _greedy_rows(student.target, adapt_files, s, deadline=started + s.greedy_share * s.minutes * 60)
    maker = SampleMaker(adapt_files, student.tokenizer, seed=s.seed)
    batch_at = student.batches(maker, greedy["rows"], s.batch_size, s.greedy_rows, s.seed,
                               deadline=started + (s.greedy_share + s.feature_share) * s.minutes * 60)
    trained = _distil(student, batch_at, s, deadline=started + s.minutes * 60)
    minutes = (time.time() - started) / 60
    card = {"repository": repo.resolve().name, "kind": student.kind,
            "target_fingerprint": target_fingerprint(target_dir), "base_draft": model_label(draft_dir),
            "files": {"adapt": len(adapt_files), "held_out": len(held_out)},
            "held_out_files": sorted(f.path.split("/", 1)[1] for f in held_out),
            "tokens": trained["tokens"], "steps": trained["steps"], "greedy_tokens": greedy["tokens"],
            "feature_tokens": student.feature_tokens,
            "minutes": round(minutes, 2), "interrupted": trained["interrupted"],
            "agreement_before": round(before, 4), "file_hashes": file_hashes(files)}
    _write(student, card, out, held)
    return read_card(out)


def _student(draft_dir: Path, target_dir: Path, s: AdaptSettings):
    """The student for this draft and target: an EAGLE-3 head on features read through the
    target's native step (packed for a GGUF file) where it has one, else the target run eagerly
    on every batch."""
    from specdec.models.eagle import is_eagle3
    from specdec.models.quantize import loads_packed
    from specdec.training.adapt_head import HeadOnFeatures, reads_features

    head = is_eagle3(draft_dir)
    target = load_model(target_dir, packed=head and loads_packed(target_dir, "auto")).train(False)
    if head and reads_features(target, s.seq_len):
        return HeadOnFeatures.load(draft_dir, target, s.seq_len)
    return _Student.load(draft_dir, target, s)


class _Student:
    """What is adapted without the target's native step: a draft model (KL + the target's argmax
    on rows) or an EAGLE-3 head (the recipe's two-step loss with the target run on each batch);
    each measured and saved its own way."""

    feature_tokens = 0  # the target runs on every batch: no features are extracted

    def __init__(self, kind: str, model, raw: dict, target, tokenizer, loss, seq_len: int):
        self.kind, self.model, self.raw, self.target, self.tokenizer = kind, model, raw, target, tokenizer
        self.loss, self.seq_len = loss, seq_len

    @classmethod
    def load(cls, draft_dir: Path, target, s: AdaptSettings) -> "_Student":
        from tokenizers import Tokenizer

        from specdec.models.eagle import is_eagle3, load_eagle3
        from specdec.training.eagle3 import head_loss_fn

        raw = json.loads((draft_dir / "config.json").read_text())
        if is_eagle3(draft_dir):
            head = load_eagle3(draft_dir, target)
            head.embed_tokens.weight.requires_grad_(False)  # the target's, as at inference
            return cls("eagle3", head, raw, target, target.tokenizer, head_loss_fn(target), s.seq_len)
        model = build_model(raw, 0)
        model.load_state_dict(load_model(draft_dir).state_dict(), strict=False)
        settings = TrainSettings(tokens=1, batch_size=s.batch_size, seq_len=s.seq_len, kd_weight=0.5,
                                 kd_hard_weight=0.2)
        tokenizer = Tokenizer.from_file(str(draft_dir / "tokenizer.json"))
        return cls("draft", model, raw, target, tokenizer, lambda m, batch: batch_loss(m, batch, settings, target),
                   s.seq_len)

    def held_out(self, files: list[SourceFile]) -> list[SourceFile]:
        return files

    def agreement(self, files: list[SourceFile], directory: Path) -> float:
        """Agreement with the target's argmax on `files` (first draft token for a head), of the
        model written in `directory`."""
        from specdec.models.eagle import load_eagle3
        from specdec.training.evaluate import head_agreement

        if self.kind == "eagle3":
            return head_agreement(self.target, load_eagle3(directory, self.target), files)["step0"]
        return draft_agreement(self.target, load_model(directory), files)

    def batches(self, maker: SampleMaker, greedy_rows: list, batch_size: int, own_per_batch: int, seed: int,
                deadline: float):
        """step -> rows of token ids: the sampler's, and `own_per_batch` of the target's greedy rows."""
        def batch_at(step: int) -> list[list[int]]:
            own = min(own_per_batch, len(greedy_rows))
            rows = maker.batch(step, batch_size - own, self.seq_len)
            return rows + [greedy_rows[(step * own + i) % len(greedy_rows)] for i in range(own)]

        return batch_at

    def save(self, out: Path) -> None:
        from specdec.training.__main__ import export_model
        from specdec.training.eagle3 import save_head

        if self.kind == "eagle3":
            save_head(self.model, self.raw, out)
        else:
            export_model(self.model, self.raw, self.tokenizer, out)


def _greedy_rows(target, files: list[SourceFile], s: AdaptSettings, deadline: float) -> dict:
    """The target's own greedy completions at random cursors, each with the end of its prompt,
    as training rows of seq_len + 1 tokens."""
    engine = Engine(target, adaptive=False, warm_up=False)
    rng, stream, tokens = random.Random(s.seed), [], 0
    while time.time() < deadline:
        f = rng.choice(files)
        cursor = rng.randrange(0, len(f.text))
        if rng.random() < 0.5:
            cursor = f.text.rfind("\n", 0, cursor) + 1
        prefix, suffix = f.text[max(0, cursor - 4000) : cursor], f.text[cursor : cursor + 1000]
        result = engine.complete(prefix, suffix, strategy="ar", mode="auto", max_tokens=48)
        if not result.tokens:
            continue
        sample = engine.prompt_for(prefix, suffix).ids + result.tokens
        stream += sample[-(s.seq_len + 1) :]
        tokens += len(result.tokens)
    rows = [stream[i : i + s.seq_len + 1] for i in range(0, len(stream) - s.seq_len, s.seq_len + 1)]
    log.info("greedy completions: %d tokens, %d rows", tokens, len(rows))
    return {"rows": rows, "tokens": tokens}


def _distil(student, batch_at, s: AdaptSettings, deadline: float) -> dict:
    from tqdm import tqdm

    model = student.model
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = new_optimizer(trained, s.lr)
    torch.manual_seed(s.seed)
    start, step, interrupted = time.time(), 0, False
    budget = max(1.0, deadline - start)
    model.train()
    bar = tqdm(total=round(budget), unit="s", desc="adapt", disable=not s.progress, leave=False)
    try:
        while step == 0 or time.time() < deadline:  # a step at least: the card's training is real
            for group in optimizer.param_groups:
                group["lr"] = s.lr * _schedule((time.time() - start) / budget)
            loss = optimizer_step(model, optimizer, trained, student.loss, batch_at(step))
            step += 1
            bar.set_postfix(loss=f"{loss.item():.3f}", step=step)
            bar.update(min(round(time.time() - start), bar.total) - bar.n)
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted at step %d: keeping what the draft learned so far", step)
    bar.close()
    model.eval()
    return {"steps": step, "tokens": step * s.batch_size * s.seq_len, "interrupted": interrupted}


def _schedule(progress: float) -> float:
    """Warm up over the first 5% of the time, hold, decay linearly over the last 30% to 10%."""
    if progress < 0.05:
        return max(0.05, progress / 0.05)
    if progress < 0.7:
        return 1.0
    return max(0.1, 1 - (progress - 0.7) / 0.3 * 0.9)


def _write(student, card: dict, out: Path, held) -> None:
    """Write beside `out`, measure what was written, then swap it into place."""
    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    student.save(staging)
    card["agreement_after"] = round(student.agreement(held, staging), 4)
    (staging / CARD).write_text(json.dumps(card, indent=2) + "\n")
    previous = out.with_name(out.name + ".previous")
    shutil.rmtree(previous, ignore_errors=True)
    if out.exists():
        out.rename(previous)
    staging.rename(out)
    shutil.rmtree(previous, ignore_errors=True)
    log.info("adapted %s written to %s: agreement %.3f -> %.3f on %d held-out files", student.kind, out,
             card["agreement_before"], card["agreement_after"], card["files"]["held_out"])
