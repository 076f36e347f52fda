"""Distance correlation between what a hospital holds and what it sends (Székely, Rizzo
and Bakirov, "Measuring and testing dependence by correlation of distances", 2007).

0 means the activations are independent of the inputs; 1 means one is a similarity
transform of the other. NoPeek (Vepakomma et al., 2020) uses it as a leakage measure
and a penalty. The distance matrices are never held whole: rows are computed in chunks,
twice (once for the row means, once for the products), so memory grows as
``n * chunk``, not ``n * n``.
"""

from __future__ import annotations

import torch

from medsplit.errors import ConfigError

__all__ = ["distance_correlation", "u_distance_correlation_sqr"]

#: Rows of a distance matrix computed at once.
DEFAULT_CHUNK = 256


def _flat(values: torch.Tensor, what: str) -> torch.Tensor:
    if values.dim() < 1 or values.shape[0] < 1:
        raise ConfigError(f"{what} needs a batch dimension with at least one record")
    return values.detach().reshape(values.shape[0], -1).to(torch.float64)


def _distances(rows: torch.Tensor, all_rows: torch.Tensor) -> torch.Tensor:
    # Not the matrix-product shortcut: its cancellation costs digits, and the tests hold
    # this to the reference library at float64 precision.
    return torch.cdist(rows, all_rows, compute_mode="donot_use_mm_for_euclid_dist")


def _row_sums(x: torch.Tensor, chunk: int) -> torch.Tensor:
    return torch.cat([_distances(x[i : i + chunk], x).sum(dim=1) for i in range(0, len(x), chunk)])


def _centred_products(
    x: torch.Tensor, y: torch.Tensor, *, unbiased: bool, chunk: int
) -> tuple[float, float, float]:
    """Sums of A*B, A*A and B*B over the double-centred (or U-centred) matrices."""
    n = len(x)
    rx, ry = _row_sums(x, chunk), _row_sums(y, chunk)
    tx, ty = rx.sum(), ry.sum()
    if unbiased:
        # U-centring (Székely and Rizzo, 2014): sums over n-2, the diagonal left out.
        mx, my = rx / (n - 2), ry / (n - 2)
        gx, gy = tx / ((n - 1) * (n - 2)), ty / ((n - 1) * (n - 2))
    else:
        mx, my = rx / n, ry / n
        gx, gy = tx / n**2, ty / n**2
    xy = xx = yy = torch.zeros((), dtype=torch.float64)
    for i in range(0, n, chunk):
        a = _distances(x[i : i + chunk], x) - mx[i : i + chunk, None] - mx[None, :] + gx
        b = _distances(y[i : i + chunk], y) - my[i : i + chunk, None] - my[None, :] + gy
        if unbiased:
            rows = torch.arange(i, min(i + chunk, n))
            a[rows - i, rows] = 0.0
            b[rows - i, rows] = 0.0
        xy = xy + (a * b).sum()
        xx = xx + (a * a).sum()
        yy = yy + (b * b).sum()
    return float(xy), float(xx), float(yy)


def distance_correlation(x: torch.Tensor, y: torch.Tensor, *, chunk: int = DEFAULT_CHUNK) -> float:
    """The sample distance correlation of ``x`` and ``y`` (records on the first axis,
    anything after it flattened), in [0, 1].

    The biased (V-statistic) estimator with double-centred distance matrices, as
    ``dcor.distance_correlation`` computes it; 0 when either side is constant. Computed
    in float64.
    """
    x, y = _flat(x, "x"), _flat(y, "y")
    _same_records(x, y)
    xy, xx, yy = _centred_products(x, y, unbiased=False, chunk=chunk)
    if xx <= 0 or yy <= 0:
        return 0.0
    return max(xy, 0.0) ** 0.5 / (xx * yy) ** 0.25


def u_distance_correlation_sqr(
    x: torch.Tensor, y: torch.Tensor, *, chunk: int = DEFAULT_CHUNK
) -> float:
    """The bias-corrected squared distance correlation (U-centred matrices, Székely and
    Rizzo, 2014), as ``dcor.u_distance_correlation_sqr``: unbiased, so it may be slightly
    negative under independence; needs at least 4 records."""
    x, y = _flat(x, "x"), _flat(y, "y")
    _same_records(x, y)
    if len(x) < 4:
        raise ConfigError(f"the unbiased estimator needs at least 4 records, got {len(x)}")
    xy, xx, yy = _centred_products(x, y, unbiased=True, chunk=chunk)
    if xx <= 0 or yy <= 0:
        return 0.0
    return xy / (xx * yy) ** 0.5


def _same_records(x: torch.Tensor, y: torch.Tensor) -> None:
    if len(x) != len(y):
        raise ConfigError(f"x holds {len(x)} records but y {len(y)}; they must pair up")


def distance_correlation_sqr_torch(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The biased squared distance correlation of ``x`` and ``a`` as a differentiable
    tensor (whole matrices: one batch at a time), for NoPeek's term; in ``a``'s dtype.

    The same estimator as :func:`distance_correlation` squared; 0 when either side is
    constant. The distances get a tiny floor inside the square root so that the
    gradient is finite when two records coincide.
    """
    if x.shape[0] != a.shape[0]:
        raise ConfigError(f"x holds {x.shape[0]} records but a {a.shape[0]}; they must pair up")
    xf = x.detach().reshape(x.shape[0], -1).to(a.dtype)
    af = a.reshape(a.shape[0], -1)

    def centred(rows: torch.Tensor) -> torch.Tensor:
        diff = rows[:, None, :] - rows[None, :, :]
        d = torch.sqrt((diff * diff).sum(-1) + 1e-12)
        return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()

    ca, cb = centred(xf), centred(af)
    xy, xx, yy = (ca * cb).mean(), (ca * ca).mean(), (cb * cb).mean()
    if float(xx.detach()) <= 0 or float(yy.detach()) <= 0:
        return (af * 0).sum()
    return xy / torch.sqrt(xx * yy)
