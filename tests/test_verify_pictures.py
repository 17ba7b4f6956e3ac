"""verify's pairs heatmap stays a readable size however many edges a local check has: labelled
and boxed per edge up to MAX_LABELLED_EDGES, the same size without labels beyond."""
import itertools

import matplotlib.image
import pytest

from condense.verify.pictures import MAX_LABELLED_EDGES, plot_pairs


def fake_report(n):
    names = [f"e{i}->logits" for i in range(n)]
    pairs = [dict(i=i, j=j, interaction=((i * 7 + j) % 5 - 2) * 0.1, interacts=(i + j) % 3 == 0)
             for i, j in itertools.combinations(range(n), 2)]
    return dict(n_edges=n, edges=names, pair_scale=1.0, pairs=pairs, tau=0.05,
                partners={nm: 1 for nm in names}, n_interacting_pairs=sum(p["interacts"] for p in pairs),
                partners_median=1)


@pytest.mark.parametrize("n", [8, MAX_LABELLED_EDGES, 300])
def test_pairs_picture_is_bounded(tmp_path, n):
    path = tmp_path / "pairs.png"
    plot_pairs(str(path), fake_report(n))
    height, width = matplotlib.image.imread(str(path)).shape[:2]
    most = (0.32 * MAX_LABELLED_EDGES + 3 + 1.5) * 120 + 1
    assert 500 < width <= most and 500 < height <= most
