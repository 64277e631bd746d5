"""One spelling each for the seed, dtype and device parameters across gdacil's public classes.

Walks every registered head, compensator, feature map and backbone, every scikit-learn estimator
and the statistics classes: no parameter is spelled ``random_state`` or ``init_seed`` (those are
deprecated aliases only, which warn and give the results of ``seed=`` bit for bit), ``dtype``
defaults are written as names, and ``dtype``/``device`` take a name or the torch object alike.
"""

import inspect
import json
import warnings

import numpy as np
import pytest
import torch

import gdacil.sklearn
from gdacil import ClassGaussians, LowRankGaussians
from gdacil._deprecation import accepted_parameters, renamed_parameters
from gdacil._validation import FLOAT_DTYPES, as_device, as_dtype
from gdacil.backbones import BACKBONES
from gdacil.drift import COMPENSATORS
from gdacil.heads import HEADS, LRRGDA, STREAMING_HEADS, SGDHead
from gdacil.io import load_tensors, save_tensors
from gdacil.stats import PooledGaussians
from gdacil.stats.feature_maps import FeatureMap
from gdacil.stats.linalg import class_top_eigh

OLD_SEED_NAMES = {"random_state", "init_seed"}


def _public_callables() -> dict:
    found = {}
    for registry in (HEADS, STREAMING_HEADS, COMPENSATORS):
        found.update({cls.__name__: cls for cls in registry.values()})
    found.update({cls.__name__: cls for cls in FeatureMap._registry.values()})
    found.update({name: getattr(gdacil.sklearn, name) for name in gdacil.sklearn.__all__})
    found.update({f"backbone:{name}": factory for name, factory in BACKBONES.items()})
    found.update({cls.__name__: cls for cls in (ClassGaussians, LowRankGaussians, PooledGaussians)})
    found["LowRankGaussians.from_dense"] = LowRankGaussians.from_dense
    found["class_top_eigh"] = class_top_eigh
    return found


PUBLIC = _public_callables()


def _parameters(obj) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(obj).parameters)


def _aliases(obj) -> dict[str, str]:
    func = obj.__init__ if isinstance(obj, type) else getattr(obj, "func", obj)
    func = func.__init__ if isinstance(func, type) else func
    return dict(getattr(func, "__renamed_parameters__", {}))


def test_the_walk_covers_every_kind():
    assert {"NCM", "SGDHead", "LRRGDA", "RanPAC", "HopDC", "WeakNonlinearSLDC", "RandomFourier",
            "LRRGDAClassifier", "RanPACClassifier", "backbone:vit", "LowRankGaussians"} <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_no_parameter_spells_the_seed_the_old_way(name):
    old = OLD_SEED_NAMES & set(_parameters(PUBLIC[name]))
    assert not old, f"{name} takes {sorted(old)}; spell it seed (old name: a deprecated alias)"
    assert set(_aliases(PUBLIC[name])) <= OLD_SEED_NAMES
    assert set(_aliases(PUBLIC[name]).values()) <= {"seed"}


@pytest.mark.parametrize("name", sorted(n for n in PUBLIC if "dtype" in _parameters(PUBLIC[n])))
def test_dtype_defaults_are_written_as_names(name):
    default = _parameters(PUBLIC[name])["dtype"].default
    assert isinstance(default, str) and default in FLOAT_DTYPES, f"{name}: dtype={default!r}"


@pytest.mark.parametrize("name", sorted(n for n in PUBLIC if "device" in _parameters(PUBLIC[n])))
def test_device_defaults_to_none(name):
    assert _parameters(PUBLIC[name])["device"].default is None


# ---------------------------------------------------------------- both spellings, same results
def _problem(n=120, d=4, C=3):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % C
    X = torch.randn(n, d, generator=g, dtype=torch.float64) + 3 * torch.eye(C, d, dtype=torch.float64)[y]
    return X, y


#: Small settings of the slow or large heads (by class name)
SMALL = {
    "LRRGDA": {"rank": 2},
    "SGDHead": {"base_steps": 20, "steps_per_class": 0, "samples_per_class": 16},
    "RanPAC": {"dim_out": 16, "lam": 1.0},
    "ACIL": {"buffer_size": 16},
    "RBFLDA": {"dim_out": 16, "bandwidth": 1.0},
}


def _head_scores(cls, **params):
    X, y = _problem()
    head = cls(**SMALL.get(cls.__name__, {}), **params)
    if cls in STREAMING_HEADS.values():
        head.fit(X, y)
    else:
        head.fit(ClassGaussians(X.shape[1]).update(X, y))
    return head, head.decision_function(X)


@pytest.mark.parametrize("cls", sorted({*HEADS.values(), *STREAMING_HEADS.values()},
                                       key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_heads_take_dtype_and_device_by_name_or_object(cls):
    head, by_name = _head_scores(cls, dtype="float32")
    _, by_object = _head_scores(cls, dtype=torch.float32)
    assert head.dtype_ == torch.float32 and by_name.dtype == torch.float32
    assert torch.equal(by_name, by_object)
    if "device" in _parameters(cls):
        scores = [_head_scores(cls, device=device)[1] for device in (None, "cpu", torch.device("cpu"))]
        assert all(torch.equal(scores[0], s) for s in scores[1:])


def _estimators():
    return [getattr(gdacil.sklearn, name) for name in sorted(gdacil.sklearn.__all__)]


@pytest.mark.parametrize("cls", _estimators(), ids=lambda c: c.__name__)
def test_estimators_take_dtype_and_device_by_name_or_object(cls):
    X, y = (t.numpy() for t in _problem())
    small = SMALL.get(cls._head_class.__name__, {})
    spellings = [{"dtype": "float32"}, {"dtype": torch.float32}, {"dtype": np.float32}]
    probas = [cls(**small, **s).fit(X, y).predict_proba(X) for s in spellings]
    assert probas[0].dtype == np.float32
    assert all(np.array_equal(probas[0], p) for p in probas[1:])
    if "device" in _parameters(cls):
        probas = [cls(**small, device=d).fit(X, y).predict_proba(X) for d in ("cpu", torch.device("cpu"))]
        assert np.array_equal(*probas)


def _compensated_means(cls, dtype):
    g = torch.Generator().manual_seed(1)
    old = torch.randn(60, 4, generator=g, dtype=torch.float64)
    new = old @ (torch.eye(4, dtype=torch.float64) + 0.1) + 0.2
    X, y = _problem()
    small = {"n_samples": 16, "steps": 5} if cls.__name__ == "WeakNonlinearSLDC" else {}
    if cls.__name__ == "HopDC":
        small = {"n_samples": 16, "topk": 10}
    comp = cls(dtype=dtype, **small).fit(old, new)
    return comp, comp.transform(ClassGaussians(4).update(X, y)).means


@pytest.mark.parametrize("cls", [c for c in COMPENSATORS.values() if "dtype" in _parameters(c)],
                         ids=lambda c: c.__name__)
def test_compensators_take_dtype_by_name_or_object(cls):
    comp, by_name = _compensated_means(cls, "float64")
    _, by_object = _compensated_means(cls, torch.float64)
    assert torch.equal(by_name, by_object)
    config = comp.get_config()
    assert config["dtype"] == "float64" and json.loads(json.dumps(config)) == config
    assert cls(dtype=torch.float32).get_config()["dtype"] == "float32"


# ---------------------------------------------------------------- the deprecated seed aliases
def _fit_sgd(**seed):
    X, y = _problem()
    return SGDHead(**SMALL["SGDHead"], **seed).fit(ClassGaussians(4).update(X, y)).rows_


def _fit_lrrgda_classifier(**seed):
    X, y = (t.numpy() for t in _problem(d=8))
    clf = gdacil.sklearn.LRRGDAClassifier(rank=2, decomposition="randomized", oversample=1, **seed)
    return torch.from_numpy(clf.fit(X, y).predict_proba(X))


def _fit_lrrgda(**seed):
    X, y = _problem(d=8)
    head = LRRGDA(rank=2, decomposition="randomized", oversample=1, **seed)
    return head.fit(ClassGaussians(8).update(X, y)).decision_function(X)


def _compress(make):
    X, y = _problem(d=8)
    return make(ClassGaussians(8).update(X, y)).eigenvectors


def _top_eigh(**seed):
    X, _ = _problem(d=8)
    A = (X.T @ X)[None]
    return class_top_eigh(A, 2, [0], decomposition="randomized", oversample=1, **seed)[0]


def _vit(**seed):
    pytest.importorskip("transformers")
    tiny = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32, "image_size": 16, "patch_size": 8}
    return torch.cat([p.flatten() for p in BACKBONES["vit"](config=tiny, **seed).model.parameters()])


#: A small seeded computation per callable with a deprecated seed alias: what it gives with
#: ``**{alias: 3}`` must be what ``seed=3`` gives
ALIASED = {
    "SGDHead": _fit_sgd,
    "LRRGDA": _fit_lrrgda,
    "LRRGDAClassifier": _fit_lrrgda_classifier,
    "LowRankGaussians": lambda **s: _compress(
        lambda st: LowRankGaussians(8, 2, decomposition="randomized", oversample=1, **s).merge(st)),
    "LowRankGaussians.from_dense": lambda **s: _compress(
        lambda st: LowRankGaussians.from_dense(st, 2, decomposition="randomized", oversample=1, **s)),
    "class_top_eigh": _top_eigh,
    "backbone:vit": _vit,
}


def test_every_deprecated_alias_has_a_bit_for_bit_check():
    aliased = {name for name, obj in PUBLIC.items() if _aliases(obj)}
    checked = {name.split(":")[0] for name in ALIASED}
    backbones = {name for name in aliased if name.startswith("backbone:")}
    assert aliased - backbones <= set(ALIASED) and (not backbones or "backbone" in checked)


@pytest.mark.parametrize("name", sorted(ALIASED))
def test_deprecated_seed_alias_warns_and_gives_the_same_result(name):
    alias = next(iter(_aliases(PUBLIC[name])))
    with pytest.warns(FutureWarning, match=f"'{alias}' is deprecated and will be removed; use 'seed'"):
        old = ALIASED[name](**{alias: 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = ALIASED[name](seed=3)
    assert torch.equal(old, new)
    assert not torch.equal(ALIASED[name](seed=4), new)


def test_passing_a_seed_and_its_alias_is_refused():
    with pytest.raises(TypeError, match="got both 'seed' and its deprecated alias 'random_state'"):
        SGDHead(seed=1, random_state=1)


def test_aliases_keep_the_signature_and_get_params_clean():
    @renamed_parameters(random_state="seed")
    def draw(*, seed=0):
        return seed

    assert list(_parameters(draw)) == ["seed"] and accepted_parameters(draw) == {"seed", "random_state"}
    assert "random_state" not in gdacil.sklearn.LRRGDAClassifier().get_params()
    assert SGDHead(seed=5).get_params()["seed"] == 5


def test_configs_accept_the_deprecated_alias():
    from gdacil.cil.config import HeadConfig, _check_head_params

    with pytest.warns(FutureWarning, match="use 'seed'"):
        _check_head_params(HeadConfig("sgd", {"random_state": 2}), "heads.sgd")


def test_low_rank_files_saved_with_random_state_still_load(tmp_path):
    X, y = _problem(d=8)
    low = LowRankGaussians.from_dense(ClassGaussians(8).update(X, y), 2, seed=7)
    low.save(tmp_path / "new.safetensors")
    tensors, meta = load_tensors(tmp_path / "new.safetensors")
    meta["random_state"] = meta.pop("seed")  # what gdacil wrote before the rename
    save_tensors(tmp_path / "old.safetensors", tensors, meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a file the user cannot fix: no warning
        back = LowRankGaussians.load(tmp_path / "old.safetensors")
    assert back.seed == 7 and torch.equal(back.eigenvectors, low.eigenvectors)


def test_head_files_with_torch_dtype_strings_still_load(tmp_path):
    from gdacil.heads import FeCAM, RanPAC

    X, y = _problem()
    for head in (RanPAC(dim_out=16, lam=1.0, dtype="float32").fit(X, y),
                 FeCAM(dtype=torch.float32).partial_fit(X, y)):
        head.save(tmp_path / "new.safetensors")
        tensors, meta = load_tensors(tmp_path / "new.safetensors")
        assert meta["params"]["dtype"] == "float32"
        meta["params"]["dtype"] = "torch.float32"  # what gdacil wrote before
        save_tensors(tmp_path / "old.safetensors", tensors, meta)
        back = type(head).load(tmp_path / "old.safetensors")
        assert torch.equal(back.decision_function(X), head.decision_function(X))
        assert back.dtype_ == torch.float32


# ---------------------------------------------------------------- errors name what is accepted
def test_errors_name_the_parameter_and_the_accepted_values():
    from gdacil.heads import NCM, RanPAC

    X, y = _problem()
    stats = ClassGaussians(4).update(X, y)
    with pytest.raises(ValueError, match=r"^dtype must be a torch dtype or its name, one of "
                                         r"'float64', 'float32', 'float16', 'bfloat16'; got 'float65'"):
        NCM(dtype="float65").fit(stats)
    with pytest.raises(ValueError, match=r"one of 'float64', 'float32'; got 'bfloat16'"):
        RanPAC(dim_out=8, dtype="bfloat16").fit(X, y)
    with pytest.raises(ValueError, match=r"^device must be None \(the CPU\), a device name such as "
                                         r"'cpu' or 'cuda:0', or a torch.device; got 3"):
        NCM(device=3).fit(stats)
    with pytest.raises(ValueError, match="screen must be a torch dtype"):
        as_dtype(torch.int8, "screen")
    assert as_dtype("torch.bfloat16") == torch.bfloat16 and as_device("cpu") == torch.device("cpu")
