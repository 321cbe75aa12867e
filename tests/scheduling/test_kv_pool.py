"""The slab pool's bookkeeping: slab-first allocation, fragmentation, compaction, reserve, prefix cache."""

import pytest

from scheduler.kv_pool import PoolExhausted, SlabPool


def make_pool(slabs=4, per_slab=4, reserve=0.0) -> SlabPool:
    return SlabPool(slabs, per_slab, page_tokens=4, reserve_frac=reserve)


def test_allocation_fills_partly_used_slabs_before_opening_new_ones():
    pool = make_pool()
    first = pool.allocate(2)
    second = pool.allocate(2)
    assert {pool.slab_of(p) for p in first + second} == {0}
    pool.check([first, second])


def test_fragmentation_counts_free_pages_stranded_in_partly_used_slabs():
    pool = make_pool(slabs=2, per_slab=4)
    pages = pool.allocate(4)  # slab 0 full
    more = pool.allocate(1)  # slab 1 partly used: 3 stranded of 3 free
    assert pool.fragmentation() == 1.0
    pool.release(pages[:2], rank=1)  # slab 0 now partly used too
    assert pool.fragmentation() == 1.0
    pool.release(more, rank=1)  # slab 1 wholly free again: only slab 0's 2 free pages are stranded
    assert pool.fragmentation() == pytest.approx(2 / 6)
    pool.check([pages[2:]])


def test_compaction_empties_sparse_slabs_and_reports_moves():
    pool = make_pool(slabs=3, per_slab=4)
    tables = [pool.allocate(1) for _ in range(12)]
    for table in tables[1::2]:  # leave every slab half used
        pool.release(table, rank=1)
    live = tables[0::2]
    before = pool.fragmentation()
    moves = pool.plan_compaction()
    live = [[moves.get(p, p) for p in t] for t in live]
    pool.check(live)
    assert moves and pool.fragmentation() < before
    used_slabs = {pool.slab_of(t[0]) for t in live}
    assert len(used_slabs) == 2  # six pages fit in two slabs of four


def test_reserve_is_only_for_callers_allowed_to_use_it():
    pool = make_pool(slabs=1, per_slab=10, reserve=0.2)
    held = pool.allocate(8)
    with pytest.raises(PoolExhausted):
        pool.allocate(1)
    held += pool.allocate(2, use_reserve=True)
    pool.check([held])


def test_prefix_pages_are_shared_by_reference_and_cached_after_release():
    pool = make_pool()
    tokens = list(range(10))  # two full pages of four, and a partial one
    pages = pool.allocate(3)
    pool.register(pages, pool.page_keys(tokens))
    again = pool.match_prefix(tokens + [99])
    assert again == pages[:2] and pool.refs[pages[0]] == 2
    pool.release(pages, rank=1)
    pool.release(again, rank=1)
    assert set(pool.lru) == set(pages[:2])  # full pages stay cached; the partial one is free
    assert pool.match_prefix(tokens) == pages[:2]
    pool.check([pages[:2]])


def test_eviction_takes_batch_pages_before_realtime_ones():
    pool = make_pool(slabs=1, per_slab=4)
    rt, batch = pool.allocate(1), pool.allocate(1)
    pool.register(rt, pool.page_keys([1, 2, 3, 4]))
    pool.register(batch, pool.page_keys([5, 6, 7, 8]))
    pool.release(batch, rank=2)
    pool.release(rt, rank=0)  # released last, but realtime: kept longer
    taken = pool.allocate(3)
    assert rt[0] in pool.lru and batch[0] not in pool.lru
    pool.check([taken])


def test_session_pins_keep_pages_and_give_way_realtime_last():
    pool = make_pool()
    a, b = pool.allocate(1), pool.allocate(1)
    pool.pin("rt-call", a, rank=0)
    pool.pin("batch-job", b, rank=2)
    pool.release(a, rank=0)
    pool.release(b, rank=2)
    assert pool.refs[a[0]] == 1 and pool.refs[b[0]] == 1
    assert pool.unpin_oldest() and "rt-call" in pool.pins and "batch-job" not in pool.pins
    pool.check([])


def test_page_keys_extend_known_keys_as_the_full_recount_would():
    pool = make_pool()
    tokens = list(range(13))
    known = pool.page_keys(tokens[:5])  # one full page
    assert len(known) == 1
    assert pool.page_keys(tokens, known) == pool.page_keys(tokens)
    assert pool.page_keys(tokens, known)[1] != pool.page_keys(tokens[4:])[0]  # chained over the prefix
