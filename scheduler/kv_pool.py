"""The KV slab pool: page bookkeeping for the paged KV cache (the tensors live in the model runner).

Device memory is carved into slabs (`slab_bytes` of one layer's K and V); a slab holds `pages_per_slab`
pages of `page_tokens` tokens, and every layer is carved the same way, so a page id names the same slot in
each layer. Why slabs: a slab whose pages are all free can be handed back or reused for anything, so the
pool fills partly used slabs first and compacts stragglers between steps, keeping whole slabs free.

Full pages are hashed (chained over the tokens before them) and stay cached when their last reference
goes: a later request with the same prefix, such as the next turn of a call, takes them back instead of
recomputing. Unreferenced cached pages are evicted least recently used first, batch work's before
interactive's before realtime's. Sessions pin their conversation prefix between turns.
"""

import math
from collections import Counter, OrderedDict
from collections.abc import Iterator
from collections.abc import Sequence as Seq


class PoolExhausted(Exception):
    pass


class SlabPool:
    def __init__(self, num_slabs: int, pages_per_slab: int, page_tokens: int, reserve_frac: float = 0.08):
        self.num_slabs, self.pages_per_slab, self.page_tokens = num_slabs, pages_per_slab, page_tokens
        self.num_pages = num_slabs * pages_per_slab
        self.reserve = math.ceil(reserve_frac * self.num_pages)
        self.refs = [0] * self.num_pages
        self.free_lists: list[list[int]] = [
            list(range((s + 1) * pages_per_slab - 1, s * pages_per_slab - 1, -1)) for s in range(num_slabs)
        ]
        self.free_count = self.num_pages  # pages in the free lists, kept as they change (read every plan)
        self.page_key: dict[int, tuple] = {}  # page -> (parent hash, tokens) of the full page it holds
        self.key_page: dict[tuple, int] = {}
        self.lru: OrderedDict[int, int] = OrderedDict()  # cached unreferenced page -> class rank of its owner
        self.lru_ranks: Counter[int] = Counter()  # how many pages of each rank `lru` holds
        self.pins: OrderedDict[str, tuple[list[int], int]] = OrderedDict()  # session -> (pages, rank)

    # -- figures ---------------------------------------------------------------------------------------
    def slab_of(self, page: int) -> int:
        return page // self.pages_per_slab

    @property
    def num_free(self) -> int:
        return self.free_count

    @property
    def num_available(self) -> int:
        """Pages an allocation can get: free ones plus cached ones that may be evicted."""
        return self.num_free + len(self.lru)

    @property
    def num_used(self) -> int:
        return self.num_pages - self.num_free

    def fragmentation(self) -> float:
        """Free pages stranded in partly used slabs, over all free pages."""
        free = self.num_free
        stranded = sum(n for n in map(len, self.free_lists) if n < self.pages_per_slab)
        return stranded / free if free else 0.0

    def pages_for(self, tokens: int) -> int:
        return (tokens + self.page_tokens - 1) // self.page_tokens

    # -- allocation ------------------------------------------------------------------------------------
    def can_allocate(self, n: int, use_reserve: bool = False) -> bool:
        return self.num_available - n >= (0 if use_reserve else self.reserve)

    def allocate(self, n: int, use_reserve: bool = False) -> list[int]:
        """Take n pages, from the fullest partly used slabs first, evicting cached pages if needed."""
        if not self.can_allocate(n, use_reserve):
            raise PoolExhausted(f"{n} pages wanted, {self.num_available} available, reserve {self.reserve}")
        pages = []
        # Free pages per slab, kept up to date here: a GPU's pool has thousands of slabs, and a scan of them
        # per page in Python was most of a simulated 13B step's host time.
        free = list(map(len, self.free_lists))
        for _ in range(n):
            if not any(free):
                self._evict_one()
                free = list(map(len, self.free_lists))
            slab = free.index(min(filter(None, free)))  # the first slab with the fewest free pages
            free[slab] -= 1
            page = self.free_lists[slab].pop()
            self.free_count -= 1
            self.refs[page] = 1
            pages.append(page)
        return pages

    def _evict_one(self) -> None:
        rank = max(r for r, n in self.lru_ranks.items() if n)  # highest rank (batch) first; LRU within a rank
        page = next(p for p, r in self.lru.items() if r == rank)
        del self.lru[page]
        self.lru_ranks[rank] -= 1
        del self.key_page[self.page_key.pop(page)]
        self.free_lists[self.slab_of(page)].append(page)
        self.free_count += 1

    def release(self, pages: Seq[int], rank: int) -> None:
        """Drop one reference from each page; cached pages stay for reuse, others go back to their slab."""
        for page in pages:
            self.refs[page] -= 1
            assert self.refs[page] >= 0, f"page {page} released twice"
            if self.refs[page] == 0:
                if page in self.page_key:
                    self.lru[page] = rank
                    self.lru.move_to_end(page)
                    self.lru_ranks[rank] += 1
                else:
                    self.free_lists[self.slab_of(page)].append(page)
                    self.free_count += 1

    # -- prefix cache ----------------------------------------------------------------------------------
    def page_keys(self, tokens: Seq[int], known: Seq[tuple] = ()) -> list[tuple]:
        """Chained keys of the full pages of a token list; `known`, the keys of its first pages, are kept.

        A growing sequence passes the keys it already has, so each step hashes only the pages that just
        filled instead of its whole history.
        """
        keys = list(known)
        keys += self._chained_keys(tokens, len(keys), hash(keys[-1]) if keys else 0)
        return keys

    def _chained_keys(self, tokens: Seq[int], first: int, parent: int) -> Iterator[tuple]:
        """The keys of full pages `first`, `first` + 1, ... of tokens, made one at a time as they are asked for."""
        size = self.page_tokens
        for i in range(first, len(tokens) // size):
            key = (parent, tuple(tokens[i * size:(i + 1) * size]))
            yield key
            parent = hash(key)

    def match_prefix(self, tokens: Seq[int]) -> list[int]:
        """Take references on the cached pages that hold a prefix of tokens (leaving one token to compute).
        Keys are made only until the first miss: a waiting prompt is matched again at every plan."""
        pages = []
        for key in self._chained_keys(tokens[:-1], 0, 0):
            page = self.key_page.get(key)
            if page is None:
                break
            if self.refs[page] == 0:
                self.lru_ranks[self.lru.pop(page)] -= 1
            self.refs[page] += 1
            pages.append(page)
        return pages

    def register(self, pages: Seq[int], keys: Seq[tuple]) -> None:
        """Make full pages findable by later requests with the same prefix (keys from `page_keys`)."""
        for page, key in zip(pages, keys, strict=False):
            if page not in self.page_key and key not in self.key_page:
                self.page_key[page], self.key_page[key] = key, page

    # -- sessions --------------------------------------------------------------------------------------
    def pin(self, session: str, pages: Seq[int], rank: int) -> None:
        """Keep a session's conversation prefix between its turns (replacing what it pinned before)."""
        for page in pages:
            self.refs[page] += 1
        self.unpin(session)
        self.pins[session] = (list(pages), rank)

    def unpin(self, session: str) -> None:
        pages, rank = self.pins.pop(session, ([], 0))
        self.release(pages, rank)

    def unpin_oldest(self) -> bool:
        """Under memory pressure, give up the pins of the least recent session, realtime sessions last."""
        if not self.pins:
            return False
        session = min(self.pins, key=lambda s: -self.pins[s][1])
        self.unpin(session)
        return True

    # -- compaction ------------------------------------------------------------------------------------
    def plan_compaction(self) -> dict[int, int]:
        """Empty the emptiest partly used slabs into the fullest ones; returns page moves {old: new}."""
        partial = sorted((s for s, f in enumerate(self.free_lists) if 0 < len(f) < self.pages_per_slab),
                         key=lambda s: len(self.free_lists[s]))
        moves: dict[int, int] = {}
        while len(partial) >= 2:
            donor = partial[-1]
            used = [p for p in self._slab_pages(donor) if p not in self.free_lists[donor]]
            room = sum(len(self.free_lists[s]) for s in partial[:-1])
            if room < len(used):
                break
            partial.pop()
            for page in used:
                receiver = next(s for s in partial if self.free_lists[s])
                new = self.free_lists[receiver].pop()
                self._move(page, new)
                moves[page] = new
            partial = [s for s in partial if self.free_lists[s]]
        return moves

    def _slab_pages(self, slab: int) -> range:
        return range(slab * self.pages_per_slab, (slab + 1) * self.pages_per_slab)

    def _move(self, old: int, new: int) -> None:
        self.refs[new], self.refs[old] = self.refs[old], 0
        if old in self.page_key:
            key = self.page_key.pop(old)
            self.page_key[new] = key
            self.key_page[key] = new
        if old in self.lru:
            self.lru[new] = self.lru.pop(old)
        for session, (pages, rank) in self.pins.items():
            self.pins[session] = ([new if p == old else p for p in pages], rank)
        self.free_lists[self.slab_of(old)].append(old)

    # -- checks ----------------------------------------------------------------------------------------
    def check(self, live_tables: Seq[Seq[int]]) -> None:
        """Assert the pool's invariants given the block tables of all live sequences."""
        owners = [0] * self.num_pages
        for table in list(live_tables) + [pages for pages, _ in self.pins.values()]:
            for page in table:
                owners[page] += 1
        free = {p for f in self.free_lists for p in f}
        assert sum(len(f) for f in self.free_lists) == len(free) == self.free_count, "a page is free twice"
        for page in range(self.num_pages):
            assert owners[page] == self.refs[page], f"page {page}: {self.refs[page]} refs, {owners[page]} owners"
            states = (page in free) + (page in self.lru) + (self.refs[page] > 0)
            assert states == 1, f"page {page} is in {states} states"
            assert (page in self.lru) <= (page in self.page_key), f"page {page} cached without a key"
        assert +self.lru_ranks == Counter(self.lru.values()), "the cached pages' ranks are miscounted"
