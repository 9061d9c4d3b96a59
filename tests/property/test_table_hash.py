"""hash_positions over packed key columns equals hashing.position key by key, compiled
and pure-Python alike, and refuses offsets that do not cut key_data."""

import os
import subprocess
import sys
from array import array

import pytest
from hypothesis import given, settings, strategies as st

from floering.node.core import columnar
from floering.node.core.columnar import pytable
from floering.node.core.columnar.buffers import encode_keys
from floering.wire.hashing import position

KERNELS = [pytable.hash_positions]
if columnar.KERNEL == "compiled":
    from floering.node.core.columnar import ctable as _table
    KERNELS.append(_table.hash_positions)

keys = st.lists(st.one_of(st.text(), st.binary(max_size=80), st.integers()), max_size=60)


@pytest.mark.parametrize("hash_positions", KERNELS, ids=lambda f: f.__module__)
@settings(max_examples=200, deadline=None)
@given(keys=keys)
def test_positions_are_the_keys_hashes(hash_positions, keys):
    kinds, data, offsets = encode_keys(keys)
    assert list(hash_positions(data, offsets)) == [position(k) for k in keys]


@pytest.mark.parametrize("hash_positions", KERNELS, ids=lambda f: f.__module__)
def test_bad_offsets_are_refused(hash_positions):
    for offsets in ([0, 5], [2, 1], [], [0, -1]):
        with pytest.raises((ValueError, OverflowError)):
            hash_positions(b"abc", array("q", offsets))
    with pytest.raises(TypeError):
        hash_positions(b"abc", array("d", [0.0, 1.0]))
    assert list(hash_positions(b"abc", array("I", [0, 1, 3]))) == [position(b"a"), position(b"bc")]


def test_the_extension_is_built_here_and_floe_pure_turns_it_off():
    assert columnar.KERNEL == "compiled"
    code = "from floering.node.core import columnar; print(columnar.KERNEL)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "FLOE_PURE": "1"}, timeout=60)
    assert out.stdout.strip() == "python", out.stderr
