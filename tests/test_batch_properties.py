"""Property-based tests: put/defrag/index_select/append round trips keep every system exactly,
for every dtype, with and without edges."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from alchemi_core.data import Batch
from alchemi_core.testing import make_batch
from alchemi_core.testing.contracts import assert_same_systems

sizes = st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=7)
dtypes = st.sampled_from([torch.float32, torch.float64])
SETTINGS = settings(max_examples=40, deadline=None)


def _batch(sz: list[int], edges: bool, dtype: torch.dtype) -> Batch:
    return make_batch(sz, edges=edges, extras=True, dtype=dtype)


@SETTINGS
@given(sizes, st.booleans(), dtypes, st.data())
def test_index_select_matches_the_structures(sz, edges, dtype, data):
    b = _batch(sz, edges, dtype)
    order = data.draw(st.permutations(range(len(sz))))
    sel = b.index_select(list(order))
    originals = b.to_data_list()
    for pos, i in enumerate(order):
        got, want = sel[pos], originals[i]
        for k in want.keys():
            assert torch.equal(got._fields[k], want._fields[k]), k


@SETTINGS
@given(sizes, st.booleans(), dtypes, st.data())
def test_put_then_defrag_accounts_for_every_system(sz, edges, dtype, data):
    src = _batch(sz, edges, dtype)
    mask_list = data.draw(st.lists(st.booleans(), min_size=len(sz), max_size=len(sz)))
    mask = torch.tensor(mask_list, dtype=torch.bool)
    cap_sys = data.draw(st.integers(min_value=0, max_value=len(sz)))
    cap_nodes = data.draw(st.integers(min_value=0, max_value=sum(sz)))
    dest = Batch.empty(num_systems=cap_sys, num_nodes=cap_nodes, num_edges=sum(sz), template=src)
    before = src.clone()
    copied = dest.put(src, mask)
    chosen = [i for i, m in enumerate(mask_list) if m][:copied]
    # What was copied is exactly the first `copied` selected systems, unchanged.
    assert_same_systems(before.index_select(chosen), dest)
    # Those that were copied leave the source; the rest stay, in order.
    src.defrag()
    rest = [i for i in range(len(sz)) if i not in chosen]
    assert_same_systems(before.index_select(rest), src)
    assert sorted(dest.system_id.tolist() + src.system_id.tolist()) == list(range(len(sz)))


@SETTINGS
@given(sizes, sizes, st.booleans(), dtypes)
def test_append_is_concatenation(a_sizes, b_sizes, edges, dtype):
    a = _batch(a_sizes, edges, dtype)
    b = _batch(b_sizes, edges, dtype)
    b.system_id.add_(100)
    expected = Batch.from_data_list(a.to_data_list() + b.to_data_list())
    a.append(b)
    assert_same_systems(expected, a)


@SETTINGS
@given(sizes, st.booleans(), dtypes, st.data())
def test_defrag_with_a_mask_then_refill_in_place(sz, edges, dtype, data):
    b = _batch(sz, edges, dtype)
    buf = Batch.empty(num_systems=len(sz), num_nodes=sum(sz), num_edges=sum(sz), template=b)
    buf.put(b)
    remove = data.draw(st.lists(st.booleans(), min_size=len(sz), max_size=len(sz)))
    buf.defrag(torch.tensor(remove))
    kept = [i for i, r in enumerate(remove) if not r]
    assert_same_systems(b.index_select(kept), buf)
    # Refill the freed room with the removed systems: everything is back exactly once.
    removed = b.index_select([i for i, r in enumerate(remove) if r])
    assert buf.put(removed) == removed.num_graphs
    assert sorted(buf.system_id.tolist()) == list(range(len(sz)))
    for sid in range(len(sz)):
        row = buf.system_id.tolist().index(sid)
        assert_same_systems(b.index_select([sid]), buf.index_select([row]))
