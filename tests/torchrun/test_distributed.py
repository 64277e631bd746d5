"""torch.distributed on 2 gloo CPU processes under torchrun: exact statistics reduction, ordered
row gathers, data-parallel Stage-1 training with NSP, and a whole `gdacil run` against one
process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _distributed_worker import DIM, rank_rows, row_data, stats_data, train_nsp
from PIL import Image

from gdacil import ClassGaussians, distributed
from gdacil.adapt import null_space_split, soft_projector
from gdacil.backbones import build_backbone
from gdacil.io import load_tensors

from _assets import TINY_VIT, needs_transformers

WORKER = Path(__file__).parents[1] / "_distributed_worker.py"


def torchrun(*args: str, cwd: Path) -> str:
    """``python -m torch.distributed.run --standalone --nproc_per_node 2 ARGS``, one thread per
    process; returns its output (fails the test with it on a non-zero exit)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    return output


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[tuple[dict, dict]]:
    """What each of the two ranks of one torchrun of the worker got (tensors, metadata)."""
    out = tmp_path_factory.mktemp("ranks")
    checks = ["stats", "rows"] + (["train"] if importlib.util.find_spec("transformers") else [])
    torchrun(str(WORKER), str(out), *checks, cwd=out)
    return [load_tensors(out / f"rank{r}.safetensors") for r in range(2)]


def stats_of(tensors: dict, prefix: str) -> tuple:
    """(labels, counts, means, scatters) that a rank saved under ``prefix``."""
    return (tensors[f"{prefix}/labels"].tolist(),
            *(tensors[f"{prefix}/{key}"] for key in ("counts", "means", "scatters")))


# ------------------------------------------------------------------ helpers without a group
def test_single_process_helpers_are_no_ops():
    assert distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.is_main_process()
    assert distributed.init_from_env() is False  # WORLD_SIZE unset: no group
    x = torch.arange(6.0).reshape(3, 2)
    assert distributed.all_gather_rows(x) is x
    assert distributed.shard([1, 2, 3]) == [1, 2, 3]
    stats = ClassGaussians(2).update(x, [0, 1, 1])
    reduced = distributed.all_reduce_stats(stats)
    assert reduced is not stats and torch.equal(reduced.scatters, stats.scatters)
    with pytest.raises(TypeError, match="dense ClassGaussians"):
        distributed.all_reduce_stats(stats.means)


def test_shards_are_contiguous_nearly_equal_and_cover_the_items():
    items = list(range(11))
    parts = [distributed.shard(items, r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [3, 3, 3, 2]
    assert [x for part in parts for x in part] == items
    assert [distributed.shard(items[:2], r, 4) for r in range(4)] == [[0], [1], [], []]
    with pytest.raises(ValueError, match="rank"):
        distributed.shard(items, 4, 4)


# ------------------------------------------------------------------ two ranks
def test_all_reduce_stats_equals_the_one_process_statistics_on_every_rank(ranks):
    X, y = stats_data()
    whole = ClassGaussians(DIM, ddof=1).update(X, y)
    (t0, _), (t1, _) = ranks
    for key in ("labels", "counts", "means", "scatters"):  # bit-identical on both ranks
        assert torch.equal(t0[f"stats/{key}"], t1[f"stats/{key}"]), key
    labels, counts, means, scatters = stats_of(t0, "stats")
    assert labels == [0, 1, 2, 3, 4, 5]  # rank 0's classes, then rank 1's new ones
    pos = whole.positions(labels)
    assert torch.equal(counts, whole.counts[pos])
    assert relative_error(means, whole.means[pos]) < 1e-10
    assert relative_error(scatters, whole.scatters[pos]) < 1e-10


def test_all_reduce_stats_with_an_empty_rank_gives_the_other_ranks_statistics(ranks):
    X, y = stats_data()
    rows = rank_rows(0)
    alone = ClassGaussians(DIM, ddof=1).update(X[rows], y[rows])
    for tensors, _ in ranks:
        labels, counts, means, scatters = stats_of(tensors, "lonely")
        assert labels == alone.classes and torch.equal(counts, alone.counts)
        assert relative_error(means, alone.means) < 1e-12
        assert relative_error(scatters, alone.scatters) < 1e-12


def test_workers_resolve_auto_precision_as_their_launcher(ranks):
    """torchrun workers inherit the environment, GDACIL_NATIVE_BF16 included: "auto" means on
    every rank what it means here."""
    from gdacil.backbones.base import resolve_precision

    assert [meta["auto_precision"] for _, meta in ranks] == [resolve_precision("auto", "cpu")] * 2


def test_all_reduce_stats_names_mismatched_dim_and_ddof_on_every_rank(ranks):
    for _, meta in ranks:
        assert meta["world"] == 2
        assert "differ in dim: [6, 7]" in meta["errors"]["dim"]
        assert "differ in ddof: [0, 1]" in meta["errors"]["ddof"]


def test_all_gather_rows_restores_the_original_order_from_unequal_blocks(ranks):
    full = row_data()
    for tensors, _ in ranks:
        assert torch.equal(tensors["rows/seven"], full)  # blocks of 4 and 3 rows
        assert torch.equal(tensors["rows/one"], full[:1])  # blocks of 1 and 0 rows
        assert tensors["rows/ints"].tolist() == [0, 10, 11]  # int64 blocks of 1 and 2


@needs_transformers
def test_data_parallel_nsp_training_matches_one_process(ranks):
    """Global batches of 5 split 3 + 2: the weighted, all-reduced gradients give the update of
    one process; the NSP moments are summed over the ranks' shards."""
    (t0, _), (t1, _) = ranks
    trained = {k: v for k, v in t0.items()
               if k.startswith(("weights/", "moments", "loss", "steps"))}
    for key, value in trained.items():  # the ranks never drift apart
        assert torch.equal(value, t1[key]), key
    for t in range(2):  # on_step saw every step's loss summed over the ranks, in order
        steps = trained[f"steps{t}"]
        assert steps[:, 0].tolist() == [0, 1, 2]
        assert steps[:, 1].tolist() == trained[f"loss{t}"].double().tolist()
    torch.set_num_threads(1)
    one = train_nsp()
    assert set(one) == set(trained)
    # float32 gradients summed in another order differ by a few ulps per step, and Adam's
    # normalisation can carry that into the update: allow 1e-5 of each tensor's scale, which
    # is still a thousandth of how far training moved the weights (checked below)
    for key, value in one.items():
        atol = 1e-5 * max(1.0, float(value.abs().max()))
        torch.testing.assert_close(trained[key], value, rtol=1e-5, atol=atol, msg=key)
    initial = build_backbone("vit", config=TINY_VIT).model.state_dict()
    moved = [k for k, v in initial.items() if not torch.equal(v, one[f"weights/{k}"])]
    assert moved  # the comparison is not vacuous: training moved the weights
    assert max(float((one[f"weights/{k}"] - initial[k]).abs().max()) for k in moved) > 1e-2
    for key, moment in one.items():  # the projector of task 1 is the one-process projector
        if key.startswith("moments0/"):
            V1, V2 = null_space_split(moment, 0.05)[0], null_space_split(trained[key], 0.05)[0]
            assert V1.shape == V2.shape, key  # the same split of the spectrum
            # Davis-Kahan: the null-space projectors differ by at most ||dM||_2 / gap, where gap
            # separates the eigenvalues on the two sides of the split (float32 sums in another
            # order move the moments by a few ulps; a small gap amplifies that)
            evals = torch.linalg.eigvalsh(moment.double())
            gap = float(evals[V1.shape[1]] - evals[V1.shape[1] - 1])
            bound = float(torch.linalg.matrix_norm((moment - trained[key]).double(), 2)) / gap
            assert bound < 1e-3, key  # the ranks' moments agree with one process's
            P1, P2 = soft_projector(V1, 0.02), soft_projector(V2, 0.02)
            torch.testing.assert_close(P2, P1, rtol=0, atol=2 * bound + 1e-12, msg=key)


def retint_test_images(root: Path, seed: int = 1) -> None:
    """Give every test image a random tint, so that predictions are arbitrary (about chance)
    and equal predictions from 1 and 2 processes say more than 'all correct'."""
    rng = np.random.default_rng(seed)
    for path in sorted((root / "test").rglob("*.png")):
        pixels = np.clip(rng.uniform(0, 255, 3) + rng.normal(0, 25, (32, 32, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(path)


@needs_transformers
def test_torchrun_gdacil_run_matches_one_process(tmp_path):
    """seqft (global batches of 5) with identity, HopDC and SLDC tracks: the same predictions,
    accuracies, statistics (to round-off) and fine-tuned weights from 2 processes as from 1.

    Pinned to fp32: 2 processes sum float32 gradients in another order, and the few ulps that
    moves the weights may flip bf16 roundings of the next forward passes, hence predictions of
    these near-chance images; "auto" would make the test depend on the CPU (bf16 where native).
    """
    import yaml

    from gdacil.cil import run_experiment

    from test_runner import TRACKS, TRAIN_TINY, color_folder, vit_config

    color_folder(tmp_path / "images")
    retint_test_images(tmp_path / "images")
    strategy = {**TRAIN_TINY, "train": {**TRAIN_TINY["train"], "batch_size": 5}}

    def config(out):
        return vit_config(tmp_path, out=out, precision="fp32", strategy=strategy,
                          compensators=TRACKS, threads=1,
                          anchors={"n": 0, "include_current": True},
                          cache_dir=str(tmp_path / f"cache-{out}"))

    one = run_experiment(config("one"), log=lambda *_: None)
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(config("two").to_dict()))
    output = torchrun("-m", "gdacil", "run", str(tmp_path / "two.yaml"), cwd=tmp_path)
    assert output.count("seed 3 task 1/3") == 1, output  # only rank 0 logs
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert one["backbone_precision"] == "fp32"
    assert one["seeds"]["3"]["none/lda"]["last_acc"] < 0.9  # predictions are not all right
    assert two == json.loads(json.dumps(one))  # every prediction, hence every accuracy
    states = [json.loads((tmp_path / d / "seed_3" / "state.json").read_text())
              for d in ("one", "two")]
    assert states[0]["evaluations"] == states[1]["evaluations"]
    for name in [*(f"stats_task3_{t}" for t in TRACKS), "backbone_task3"]:
        a, b = (load_tensors(tmp_path / d / "seed_3" / f"{name}.safetensors")[0]
                for d in ("one", "two"))
        assert a.keys() == b.keys()
        for key in a:  # float32 weights: 1e-5 of the tensor's scale, as in the NSP test above
            atol = 1e-5 * max(1.0, float(a[key].abs().max()))
            torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=atol, msg=f"{name} {key}")
