"""The periodic measures behind the cell checks, against a system-by-system computation with
numpy's linear algebra: volume, area or length of the periodic part and the widths across it."""

from __future__ import annotations

import numpy as np

from alchemi_core.data.cells import periodic_measures


def _one_system(cell: np.ndarray, pbc: np.ndarray) -> tuple[float, float, list[float]]:
    rows = [cell[i] if pbc[i] else np.zeros(3) for i in range(3)]
    axes = [i for i in range(3) if pbc[i]]
    lengths = [float(np.linalg.norm(r)) for r in rows]
    if len(axes) == 3:
        size = abs(float(np.linalg.det(np.array(rows))))
        widths = [size / float(np.linalg.norm(np.cross(rows[(i + 1) % 3], rows[(i + 2) % 3]))) for i in range(3)]
    elif len(axes) == 2:
        a, b = (rows[i] for i in axes)
        size = float(np.linalg.norm(np.cross(a, b)))
        widths = [np.inf] * 3
        for i, j in ((axes[0], axes[1]), (axes[1], axes[0])):
            widths[i] = size / lengths[j]  # across axis i: the area over the other row's length
    elif len(axes) == 1:
        size = lengths[axes[0]]
        widths = [np.inf] * 3
        widths[axes[0]] = size
    else:
        size, widths = 0.0, [np.inf] * 3
    scale = 1.0 if len(axes) == 1 else float(np.prod([lengths[i] for i in axes]))
    return size, scale, widths


def test_measures_equal_numpys_linear_algebra_for_every_kind_of_periodicity():
    rng = np.random.default_rng(7)
    cells = rng.normal(size=(400, 3, 3)) * rng.uniform(0.5, 20.0, size=(400, 1, 1))
    pbc = rng.random((400, 3)) < 0.6
    pbc[:8] = [[True] * 3, [True, True, False], [False, True, True], [True, False, True],
               [True, False, False], [False, False, True], [False] * 3, [True] * 3]
    size, scale, widths = periodic_measures(cells, pbc)
    for s in range(len(cells)):
        want_size, want_scale, want_widths = _one_system(cells[s], pbc[s])
        assert np.isclose(size[s], want_size, rtol=1e-10), s
        assert np.isclose(scale[s], want_scale, rtol=1e-12), s
        assert np.allclose(widths[s], want_widths, rtol=1e-10), s


def test_degenerate_cells_measure_next_to_nothing_against_their_scale():
    cells = np.array([np.eye(3) * 4.0] * 3)
    cells[0, 2] = cells[0, 1]  # two equal rows
    cells[1, 2] = cells[1, 0] + cells[1, 1]  # three coplanar rows
    cells[2, 1] = 0.0  # a zero row on a periodic axis
    size, scale, _ = periodic_measures(cells, np.ones((3, 3), dtype=bool))
    assert (size <= 1e-10 * np.maximum(scale, 1.0)).all()
