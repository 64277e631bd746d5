import pytest
import torch

from gdacil.stats.linalg import (
    NumericalWarning,
    orthonormalize,
    psd_cholesky,
    psd_factor,
    randomized_top_eigh,
    reorthonormalize,
    top_eigh,
)

f64 = {"dtype": torch.float64}


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def low_rank_psd(batch, d, rank, seed=0):
    G = torch.randn(batch, d, rank, generator=gen(seed), **f64)
    return G @ G.transpose(1, 2)


def test_psd_cholesky_leaves_good_matrices_alone_and_jitters_singular_ones():
    good = low_rank_psd(2, 6, 10) + torch.eye(6, **f64)
    L = psd_cholesky(good)
    assert torch.allclose(L @ L.transpose(1, 2), good, atol=1e-12)
    singular = torch.stack([good[0], low_rank_psd(1, 6, 2)[0]])
    with pytest.warns(NumericalWarning, match="1 matrix"):
        L = psd_cholesky(singular)
    assert torch.isfinite(L).all()
    assert torch.allclose(L[0], torch.linalg.cholesky(good[0]))  # untouched
    rebuilt = L[1] @ L[1].T
    assert (rebuilt - singular[1]).abs().max() < 1e-4 * singular[1].diagonal().mean()


def test_psd_cholesky_refuses_nan_and_indefinite_matrices():
    with pytest.raises(ValueError, match="NaN or inf"):
        psd_cholesky(torch.full((3, 3), float("nan"), **f64))
    with pytest.raises(ValueError, match="thing: could not be factorised"):
        psd_cholesky(-torch.eye(3, **f64), name="thing", max_tries=3)


def test_psd_cholesky_of_a_zero_matrix_is_regularised_at_unit_scale():
    with pytest.warns(NumericalWarning):
        L = psd_cholesky(torch.zeros(3, 3, **f64))
    assert L.diagonal().min() > 1e-6  # a usable factor, not one of ~1e-150


def test_psd_factor_is_exact_for_singular_matrices():
    A = low_rank_psd(3, 8, 3)
    F = psd_factor(A)
    assert torch.allclose(F @ F.transpose(1, 2), A, atol=1e-10)


@pytest.mark.parametrize("dependent", [False, True])
def test_orthonormalize_spans_the_columns(dependent):
    Y = torch.randn(4, 50, 12, generator=gen(1), **f64)
    if dependent:
        Y[..., 6:] = Y[..., :6] * 2.0  # rank 6: CholeskyQR cannot finish, Householder takes over
    Q = orthonormalize(Y)
    assert (Q.transpose(1, 2) @ Q - torch.eye(12, **f64)).abs().max() < 1e-10
    # every column of Y lies in span(Q)
    assert (Q @ (Q.transpose(1, 2) @ Y) - Y).abs().max() < 1e-10 * Y.abs().max()


def decaying_psd(batch, d, seed=0):
    U = torch.linalg.qr(torch.randn(batch, d, d, generator=gen(seed), **f64))[0]
    return (U * 0.7 ** torch.arange(d, **f64)) @ U.transpose(1, 2)


@pytest.mark.parametrize("true_rank", [3, 64])
def test_randomized_top_eigh_matches_exact_including_rank_deficient_inputs(true_rank):
    A = low_rank_psd(3, 64, true_rank, seed=2) if true_rank < 64 else decaying_psd(3, 64, seed=2)
    U, s = randomized_top_eigh(A, 8, oversample=10, n_iter=6, generator=gen(3))
    U0, s0 = top_eigh(A, 8)
    assert torch.allclose(s, s0, rtol=1e-6, atol=1e-9 * s0.max())
    # compare the projectors onto the leading eigenvectors that carry real energy
    keep = min(true_rank, 8)
    P = U[..., :keep] @ U[..., :keep].transpose(1, 2)
    P0 = U0[..., :keep] @ U0[..., :keep].transpose(1, 2)
    assert (P - P0).abs().max() < 1e-5


def hard_spectrum_covariances(d=160, rank=16, n_classes=6, seed=0):
    """Class covariances whose eigenvalues around ``rank`` are nearly equal (relative gaps
    1e-3 to 1e-2) and decay slowly after: a few power iterations leave the top-``rank`` model
    far from the exact one."""
    g = torch.Generator().manual_seed(seed)
    covs = []
    for c in range(n_classes):
        Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
        gap = 10.0 ** -(2 + c % 2)
        ev = torch.cat([torch.linspace(10.0, 4.0, rank - 1, dtype=torch.float64),
                        torch.tensor([4.0 * (1 - gap)], dtype=torch.float64),
                        torch.linspace(4.0 * (1 - 2 * gap), 2.0, 40, dtype=torch.float64),
                        torch.linspace(1.0, 0.01, d - rank - 40, dtype=torch.float64)])
        covs.append((Q * ev) @ Q.T)
    return torch.stack(covs)


def test_randomized_top_eigh_converges_to_the_exact_model_on_nearly_equal_eigenvalues():
    A = hard_spectrum_covariances()
    exact_U, exact_s = top_eigh(A, 16)
    exact = exact_U @ torch.diag_embed(exact_s) @ exact_U.transpose(-1, -2)
    omega = torch.randn(*A.shape[:-1], 24, generator=torch.Generator().manual_seed(1),
                        dtype=torch.float64)
    unchecked_U, unchecked_s = randomized_top_eigh(A, 16, n_iter=4, test_matrix=omega, tol=None)
    unchecked = unchecked_U @ torch.diag_embed(unchecked_s) @ unchecked_U.transpose(-1, -2)
    assert ((unchecked - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2))).min() > 1e-3
    U, s = randomized_top_eigh(A, 16, n_iter=4, test_matrix=omega)
    model = U @ torch.diag_embed(s) @ U.transpose(-1, -2)
    assert ((model - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2))).max() < 1e-8
    torch.testing.assert_close(s, exact_s, rtol=1e-10, atol=0)


def test_randomized_top_eigh_returns_the_first_round_when_it_has_converged():
    g = torch.Generator().manual_seed(2)
    Q = torch.linalg.qr(torch.randn(4, 120, 120, generator=g, dtype=torch.float64))[0]
    ev = 0.5 ** torch.arange(120, dtype=torch.float64)   # fast decay: converged after 4 iterations
    A = (Q * ev) @ Q.transpose(-1, -2)
    omega = torch.randn(4, 120, 24, generator=g, dtype=torch.float64)
    checked = randomized_top_eigh(A, 16, test_matrix=omega)
    unchecked = randomized_top_eigh(A, 16, test_matrix=omega, tol=None)
    assert all(torch.equal(a, b) for a, b in zip(checked, unchecked))


def test_lr_rgda_default_decomposition_predicts_like_eigh_on_hard_spectra():
    from gdacil import ClassGaussians
    from gdacil.heads import LRRGDA

    d, rank = 160, 16
    covs = hard_spectrum_covariances(d, rank, n_classes=6)
    g = torch.Generator().manual_seed(3)
    means = 0.3 * torch.randn(6, d, generator=g, dtype=torch.float64)
    stats = ClassGaussians.from_moments(list(range(6)), means, covs, torch.full((6,), 500.0))
    noise = torch.randn(600, d, generator=g, dtype=torch.float64)
    X = means[torch.arange(600) % 6] + noise @ torch.linalg.cholesky(covs.mean(0)).T
    default = LRRGDA(rank=rank).fit(stats)
    exact = LRRGDA(rank=rank, decomposition="eigh").fit(stats)
    scores, reference = default.decision_function(X), exact.decision_function(X)
    scale = reference.abs().max().item()
    torch.testing.assert_close(scores, reference, rtol=1e-6, atol=1e-6 * scale)
    assert torch.equal(default.predict(X), exact.predict(X))


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-11), (torch.float32, 1e-4)])
def test_top_eigh_on_cpu_matches_the_full_decomposition_and_reports_the_smallest_eigenvalue(
        dtype, rtol):
    """The LAPACK route (tridiagonalise, top eigenpairs by MRRR, carry them back) against a full
    float64 ``torch.linalg.eigh``, on the hard spectra with nearly equal eigenvalues around the
    rank, in batches of any shape."""
    A = hard_spectrum_covariances(d=96, rank=12, n_classes=4)
    A[1] -= 0.05 * torch.eye(96, **f64)            # one indefinite matrix
    full, V = torch.linalg.eigh(A)
    exact = (V[..., -12:] * full[..., None, -12:].clamp_min(0)) @ V[..., -12:].transpose(1, 2)
    U, s, smallest = top_eigh(A.to(dtype).reshape(2, 2, 96, 96), 12, return_smallest=True)
    assert U.shape == (2, 2, 96, 12) and s.shape == (2, 2, 12) and smallest.shape == (2, 2)
    assert U.dtype == s.dtype == smallest.dtype == dtype
    U, s = U.reshape(4, 96, 12).double(), s.reshape(4, 12).double()
    torch.testing.assert_close(s, full.flip(-1)[:, :12].clamp_min(0), rtol=rtol, atol=0)
    torch.testing.assert_close(smallest.reshape(4).double(), full[:, 0], rtol=rtol, atol=rtol)
    model = U @ torch.diag_embed(s) @ U.transpose(1, 2)
    assert ((model - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2))).max() < 10 * rtol
    eye = torch.eye(12, **f64)
    assert (U.transpose(1, 2) @ U - eye).abs().max() < 100 * rtol


def test_top_eigh_of_the_full_rank_and_of_an_empty_batch():
    A = decaying_psd(2, 10, seed=4)
    U, s = top_eigh(A, 10)            # every eigenpair: the full decomposition
    torch.testing.assert_close(U @ torch.diag_embed(s) @ U.transpose(1, 2), A)
    U, s, smallest = top_eigh(A[:0], 3, return_smallest=True)
    assert U.shape == (0, 10, 3) and s.shape == (0, 3) and smallest.shape == (0,)


def test_reorthonormalize_cleans_nearly_orthonormal_columns_in_place_of_a_full_qr():
    Q = torch.linalg.qr(torch.randn(3, 50, 6, generator=gen(8), **f64))[0]
    U = Q + 1e-4 * torch.randn(3, 50, 6, generator=gen(9), **f64)   # float32-like eigenvectors
    V = reorthonormalize(U)
    assert (V.transpose(1, 2) @ V - torch.eye(6, **f64)).abs().max() < 1e-13
    assert (V - U).abs().max() < 1e-3                 # each column stays where it was


def test_top_eigh_without_scipy_takes_the_full_decomposition(monkeypatch):
    import gdacil.stats.linalg as linalg

    A = hard_spectrum_covariances(d=64, rank=8, n_classes=2)
    fast = top_eigh(A, 8, return_smallest=True)
    monkeypatch.setattr(linalg, "_lapack", lambda: None)     # SciPy is an optional dependency
    slow = top_eigh(A, 8, return_smallest=True)
    model = [U @ torch.diag_embed(s) @ U.transpose(1, 2) for U, s, _ in (fast, slow)]
    torch.testing.assert_close(model[0], model[1], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fast[2], slow[2], rtol=1e-10, atol=1e-12)
    with pytest.raises(ModuleNotFoundError, match="needs SciPy"):
        linalg.lapack_top_eigh(A[0].numpy(), 8)
