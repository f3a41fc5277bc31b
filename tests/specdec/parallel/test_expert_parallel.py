"""Expert parallelism over torch.distributed: two gloo ranks launched by torchrun."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from specdec import Engine, load_model
from specdec.parallel.distributed import ExpertParallelError, placement, rank_loads, read_statistics
from tests.helpers import free_port
from tests.specdec.parallel.ep_worker import PROMPT

ROOT = Path(__file__).resolve().parents[3]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _torchrun_command(*args) -> list[str]:
    return [str(TORCHRUN), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            *map(str, args)]


def _torchrun(*args, timeout=120, env=None):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(_torchrun_command(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=environment)


def _worker_pid(launcher: int, rank: int) -> int:
    """The pid of torchrun's worker of that rank (read from /proc)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no rank {rank} among {children}")


def test_placement_contiguous_and_balanced():
    assert placement(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    load = [100, 90, 1, 1, 1, 1, 80, 70]
    balanced = placement(8, 2, load)
    assert sorted(sum(balanced, [])) == list(range(8)) and all(len(r) == 4 for r in balanced)
    before, after = rank_loads(load, placement(8, 2)), rank_loads(load, balanced)
    assert max(after) < max(before) and sum(after) == sum(before)
    with pytest.raises(ExpertParallelError, match="do not divide"):
        placement(6, 4)


def test_statistics_files(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"expert_load": {"tokens_per_expert": [[1, 2], [3, 4]]}}))
    assert read_statistics(tmp_path / "results.json") == [[1, 2], [3, 4]]
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ExpertParallelError, match="no tokens_per_expert"):
        read_statistics(tmp_path / "bad.json")


def test_sharded_loading_reads_only_the_ranks_experts(tiny_models):
    full = load_model(tiny_models[0])
    mine = {layer: [3, 1] for layer in full.config.sparse_layers}
    shard = load_model(tiny_models[0], experts=mine)
    for layer in full.config.sparse_layers:
        a, b = full.model.layers[layer].mlp.experts, shard.model.layers[layer].mlp.experts
        assert b.gate_up_proj.shape[0] == 2
        assert torch.equal(b.gate_up_proj, a.gate_up_proj[[3, 1]]) and torch.equal(b.down_proj, a.down_proj[[3, 1]])
        assert torch.equal(shard.model.layers[layer].self_attn.o_proj.weight, full.model.layers[layer].self_attn.o_proj.weight)


@pytest.fixture(scope="module")
def two_ranks(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("ep") / "out.pt"
    run = _torchrun(ROOT / "tests/specdec/parallel/ep_worker.py", *tiny_models, out, "strategies")
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out), run


def test_two_ranks_match_one_process(two_ranks, tiny_models):
    result, run = two_ranks
    assert json.loads(run.stdout.strip().splitlines()[-1])["world"] == 2
    engine = Engine.from_pretrained(*tiny_models, adaptive=False)
    for strategy, tokens in result["tokens"].items():
        assert engine.complete(PROMPT, "", strategy=strategy, max_tokens=24).tokens == tokens, strategy
    engine.target.native_step = None  # the ranks run the eager step (no native one for a shard)
    reference = engine.target.logits(result["ids"])
    assert torch.allclose(result["logits"], reference, atol=1e-5, rtol=0)
    assert result["bytes_per_forward"] > 0


def test_cli_complete_under_torchrun(tiny_models, tmp_path):
    source = tmp_path / "m.py"
    source.write_text(PROMPT + "\n")
    args = [source, "--line", str(PROMPT.count("\n") + 1), "--col", "4", "--json", "--max-tokens", "16",
            "--target", tiny_models[0], "--draft", tiny_models[1], "--strategy", "hybrid"]
    single = subprocess.run([sys.executable, "-m", "specdec.cli", "complete", *map(str, args)], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert single.returncode == 0, single.stderr[-2000:]
    parallel = _torchrun("-m", "specdec.cli", "complete", *args, "--expert-parallel")
    assert parallel.returncode == 0, parallel.stderr[-3000:]
    assert json.loads(parallel.stdout)["tokens"] == json.loads(single.stdout)["tokens"]


def test_a_killed_rank_stops_the_group(tiny_models, tmp_path):
    started = time.monotonic()
    run = _torchrun(ROOT / "tests/specdec/parallel/ep_worker.py", *tiny_models, tmp_path / "out.pt", "die", timeout=60)
    assert run.returncode != 0 and time.monotonic() - started < 30


def test_the_leader_names_a_dead_rank(tiny_models, tmp_path):
    """Started without torchrun's agent (which would stop the leader itself): the leader's own
    error, within the timeout, names the failure."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "SPECDEC_EP_TIMEOUT": "10"}
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests/specdec/parallel/ep_worker.py"), *map(str, tiny_models),
                                       str(tmp_path / "out.pt"), "die"], env=env, stderr=subprocess.PIPE, text=True))
    started = time.monotonic()
    try:
        _, err = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0 and time.monotonic() - started < 30
    assert "expert-parallel group failed on rank 0 of 2" in err


def test_without_torchrun_the_flag_is_refused(tiny_models, tmp_path):
    source = tmp_path / "m.py"
    source.write_text("x = 1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([sys.executable, "-m", "specdec.cli", "complete", str(source), "--line", "1", "--col", "5",
                          "--target", str(tiny_models[0]), "--expert-parallel"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=60)
    assert run.returncode == 1 and "needs torchrun" in run.stderr


def test_serve_under_torchrun_answers_and_stops_cleanly(tiny_models, tmp_path):
    """Rank 0 serves HTTP while rank 1 follows; Ctrl-C on rank 0 stops both, and torchrun exits 0."""
    import signal

    import httpx

    port = free_port()
    command = _torchrun_command("-m", "specdec.cli", "serve", "--target", tiny_models[0], "--draft", tiny_models[1],
                                "--port", port, "--expert-parallel")
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        answer = httpx.post(f"{url}/infill", json={"input_prefix": PROMPT, "n_predict": 8}, timeout=60)
        assert answer.status_code == 200 and answer.json()["timings"]["predicted_n"] > 0
        os.kill(_worker_pid(proc.pid, rank=0), signal.SIGINT)
        assert proc.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
