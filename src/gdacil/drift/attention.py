"""Chunked softmax retrieval: ``softmax_topk(scale * Q K^T + b) V``, one block of queries at a time.

This is the one kernel behind HopDC (keys are the L2-normalised old anchors, values their drifts,
``scale = 1 / tau``) and SDC (a Gaussian kernel ``exp(-||q - k||^2 / (2 sigma^2))`` is a softmax
with ``scale = 1 / sigma^2`` and key bias ``b_i = -||k_i||^2 / (2 sigma^2)``; the query's own norm
is the same for every key and cancels).

With ``topk = k`` the softmax runs over each query's ``k`` largest logits only, which equals the
reference code's "softmax over all keys, zero all but the top k, renormalise". Peak memory is
``chunk_size x N`` weights plus ``chunk_size x d`` outputs, whatever the number of queries.
"""

from __future__ import annotations

import torch

__all__ = ["attention_weights", "retrieve"]


def attention_weights(
    queries: torch.Tensor,
    keys: torch.Tensor,
    *,
    scale: float,
    key_bias: torch.Tensor | None = None,
    topk: int | None = None,
) -> torch.Tensor:
    """Dense attention weights ``(m, N)`` of ``queries (m, d)`` over ``keys (N, d)``.

    Each row sums to one; with ``topk`` all but the ``topk`` largest logits of a row get weight
    exactly zero. Queries are cast to the keys' dtype.
    """
    logits = (queries.to(keys.dtype) @ keys.T) * scale
    if key_bias is not None:
        logits = logits + key_bias
    if topk is None or topk >= keys.shape[0]:
        return torch.softmax(logits, dim=1)
    top, index = logits.topk(topk, dim=1)
    return torch.zeros_like(logits).scatter_(1, index, torch.softmax(top, dim=1))


def retrieve(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    scale: float,
    key_bias: torch.Tensor | None = None,
    topk: int | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """``attention_weights(queries, keys, ...) @ values`` computed ``chunk_size`` queries at a time.

    Every row depends only on its own query, so the result does not depend on ``chunk_size``
    (beyond the round-off of differently blocked matrix products).
    """
    out = torch.empty((queries.shape[0], values.shape[1]), dtype=values.dtype,
                      device=values.device)
    for start in range(0, queries.shape[0], chunk_size):
        stop = start + chunk_size
        weights = attention_weights(queries[start:stop], keys, scale=scale, key_bias=key_bias,
                                    topk=topk)
        out[start:stop] = weights @ values
    return out
