"""DataLoader(shard=(rank, ranks)): each rank's batches are its slices of one process's batches."""
import minidnn  # noqa: F401  first (see conftest)
import numpy as np
import pytest
from minidnn.data import DataLoader, synthetic
from minidnn.distributed import shard_range
from minidnn.errors import DataError


def test_shard_range_splits_in_rank_order():
    for n in range(1, 20):
        for size in range(1, 5):
            ranges = [shard_range(n, r, size) for r in range(size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            sizes = [hi - lo for lo, hi in ranges]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("n", [40, 43, 41])     # 43: a last batch of 3; 41: of 1, fewer than the ranks
def test_ranks_take_disjoint_slices_of_every_global_batch(n, ranks):
    data = synthetic((3, 8, 8), n=n, seed=3)
    kw = dict(batch_size=8, shuffle=True, seed=5, augment="crop+flip", pad=2, prefetch=0)
    one = list(DataLoader(data, **kw))
    many = [list(DataLoader(data, shard=(r, ranks), **kw)) for r in range(ranks)]
    assert len({len(m) for m in many}) == 1                # every rank the same number of steps
    # as many as one process: a last batch with fewer samples than ranks leaves some an empty slice
    assert len(many[0]) == len(one) == len(DataLoader(data, shard=(0, ranks), **kw))
    for b in range(len(many[0])):
        x = np.concatenate([m[b][0] for m in many])
        y = np.concatenate([m[b][1] for m in many])
        np.testing.assert_array_equal(x, one[b][0])         # the same shuffle and augmentation
        np.testing.assert_array_equal(y, one[b][1])


def test_a_batch_smaller_than_the_ranks_is_refused():
    with pytest.raises(DataError, match="cannot be shared by 4 ranks"):
        DataLoader(synthetic((3, 8, 8), n=10), batch_size=3, shard=(0, 4))
