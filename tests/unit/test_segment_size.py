"""Log segments sized to their volume: a 32nd of its free space, 1 to 64 MiB. Only whole
segments are deleted, so on a small volume 64 MiB segments would fill it before one
could go; sized to it, checkpoints give space back as a feed goes on."""

from __future__ import annotations


import pytest

from floering.node.storage.segment_log import segment_size, volume_segment_size
from tests.support.segment_size_shared import GiB, MiB


@pytest.mark.parametrize("free, size", [
    (-1, MiB), (0, MiB), (10 * MiB, MiB), (24 * MiB, MiB), (64 * MiB, 2 * MiB),
    (100 * MiB, 3 * MiB), (1 * GiB, 32 * MiB), (2 * GiB, 64 * MiB), (1 << 50, 64 * MiB)])
def test_a_segment_is_a_32nd_of_the_free_space_in_whole_mib_from_1_to_64(free, size):
    assert segment_size(free) == size


def test_the_size_grows_with_the_volume_and_never_leaves_its_bounds():
    sizes = [segment_size(free) for free in range(0, 4 * GiB, 7 * MiB + 12345)]
    assert sizes == sorted(sizes) and all(s % MiB == 0 and MiB <= s <= 64 * MiB
                                          for s in sizes)
    assert volume_segment_size("/no/such/dir/below/root") == volume_segment_size("/")
