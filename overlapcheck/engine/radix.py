"""The radix prefix cache (``EngineConfig.prefix_cache``, docs/design.md §4.13): a tree of
committed token prefixes over whole KV pages, with lock counts. Plain Python; no
device values.

A node owns the pages of its key. A key holds one entry per KV position: the pair
(token at p, token at p + 1). The pair and not the token alone, because the KV at a
position is not always a function of the tokens up to it: an EAGLE draft's pair at p
holds the token at p + 1 (``drafts_eagle``), so two requests may share position p only
when they also agree on the token after it. Keys are cut at page boundaries only:
every node's key is a whole number of pages, and a node splits at a page boundary.

- ``match(keys)``: the longest cached page-aligned prefix; returns the node where it
  ends (splitting a node the match ends inside) and the pages along the path.
- ``lock(node)`` / ``unlock(node, fence)``: a request reading a matched prefix holds
  one lock on every node from its node up to the root (inc_lock_ref / dec_lock_ref);
  ``fence`` is the newest batch that may still read the path's pages, kept per node.
- ``insert(keys, pages)``: a finished request's committed KV; returns how many leading
  positions the tree already held (the caller frees its own duplicates of them).
- ``evict(n, ...)``: unlocked leaves, least recently used first, until ``n`` pages
  went; each with its fence, so that the caller parks pages a batch still in flight
  may read until that batch is processed.

Least recently used is a logical clock (one tick per match or insert), never time, so
a run is the same on every machine.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

Key = Tuple[Tuple[int, int], ...]


def pair_keys(tokens: Sequence[int], n: int) -> Key:
    """The keys of positions ``0..n-1`` of ``tokens`` (needs ``n < len(tokens)``)."""
    return tuple(zip(tokens[:n], tokens[1:n + 1]))


class Node:
    __slots__ = ("key", "pages", "children", "parent", "lock", "used", "fence", "serial")

    def __init__(self, key: Key, pages: List[int], parent: Optional["Node"], serial: int):
        self.key, self.pages, self.parent, self.serial = key, pages, parent, serial
        self.children: Dict[Key, "Node"] = {}
        self.lock = 0            # requests whose matched path runs through this node
        self.used = 0            # logical clock of the last match or insert through it
        self.fence = -1          # newest batch that may read its pages (-1: none)


class RadixCache:
    def __init__(self, page_size: int):
        self.ps = page_size
        self._serial = 0
        self.root = Node((), [], None, self._new_serial())
        self.clock = 0
        self.pages = 0           # pages the tree holds

    def _new_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _first(self, key: Key) -> Key:
        return key[:self.ps]

    def _common(self, a: Key, b: Key) -> int:
        """Positions ``a`` and ``b`` share, in whole pages."""
        n, ps = min(len(a), len(b)), self.ps
        i = 0
        while i + ps <= n and a[i:i + ps] == b[i:i + ps]:
            i += ps
        return i

    def _split(self, node: Node, at: int) -> Node:
        """Cut ``node`` at position ``at`` (page aligned): a new parent holds the first
        part and takes over the node's locks and fence; returns it."""
        pages_at = at // self.ps
        mid = Node(node.key[:at], node.pages[:pages_at], node.parent, self._new_serial())
        mid.lock, mid.used, mid.fence = node.lock, node.used, node.fence
        node.parent.children[self._first(mid.key)] = mid
        node.key, node.pages, node.parent = node.key[at:], node.pages[pages_at:], mid
        mid.children[self._first(node.key)] = node
        return mid

    # -- match, lock ----------------------------------------------------------------------
    def match(self, keys: Key) -> Tuple[Node, List[int]]:
        """The longest cached prefix of ``keys`` in whole pages: the node where it ends
        and the pages of positions ``0..len(pages) * page_size - 1``."""
        keys = keys[:len(keys) // self.ps * self.ps]
        now, node, pages, i = self._tick(), self.root, [], 0
        while i < len(keys):
            child = node.children.get(self._first(keys[i:]))
            if child is None:
                break
            n = self._common(child.key, keys[i:])
            if n < len(child.key):
                child = self._split(child, n)
            child.used = now
            pages += child.pages
            node, i = child, i + n
        return node, pages

    def lock(self, node: Node) -> None:
        while node is not self.root:
            node.lock += 1
            node = node.parent

    def unlock(self, node: Node, fence: int) -> None:
        while node is not self.root:
            if node.lock <= 0:
                raise AssertionError(f"unlock of a radix node with no lock (pages {node.pages})")
            node.lock -= 1
            node.fence = max(node.fence, fence)
            node = node.parent

    # -- insert ----------------------------------------------------------------------------
    def insert(self, keys: Key, pages: List[int], fence: int) -> int:
        """Cache ``pages`` (one per page of ``keys``); returns the positions the tree
        already held, whose pages stay the tree's (the caller's own copies of them are
        duplicates). ``fence``: the newest batch that may still read the new pages."""
        now, node, i = self._tick(), self.root, 0
        while i < len(keys):
            child = node.children.get(self._first(keys[i:]))
            if child is None:
                leaf = Node(keys[i:], list(pages[i // self.ps:]), node, self._new_serial())
                leaf.used, leaf.fence = now, fence
                node.children[self._first(leaf.key)] = leaf
                self.pages += len(leaf.pages)
                return i
            n = self._common(child.key, keys[i:])
            if n < len(child.key):
                child = self._split(child, n)
            child.used = now
            node, i = child, i + n
        return i

    # -- eviction ----------------------------------------------------------------------------
    def evictable(self) -> int:
        """Pages of unlocked nodes (evicting leaves frees their parents in turn)."""
        out, stack = 0, list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.lock == 0:
                out += len(n.pages)
            stack.extend(n.children.values())
        return out

    def _leaves(self) -> List[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif n.lock == 0:
                out.append(n)
        return out

    def evict(self, n: int) -> List[Tuple[List[int], int]]:
        """Remove unlocked leaves, least recently used first, until ``n`` pages went or
        none is left; returns (pages, fence) per removed node."""
        out, gone = [], 0
        leaves = self._leaves()
        while gone < n and leaves:
            leaf = min(leaves, key=lambda x: (x.used, x.serial))
            leaves.remove(leaf)
            parent = leaf.parent
            del parent.children[self._first(leaf.key)]
            out.append((leaf.pages, leaf.fence))
            gone += len(leaf.pages)
            self.pages -= len(leaf.pages)
            if parent is not self.root and not parent.children and parent.lock == 0:
                leaves.append(parent)
        return out

    # -- observation ---------------------------------------------------------------------------
    def page_locks(self) -> Dict[int, int]:
        """page -> lock count, for every page the tree holds."""
        out, stack = {}, list(self.root.children.values())
        while stack:
            n = stack.pop()
            for p in n.pages:
                out[p] = n.lock
            stack.extend(n.children.values())
        return out

    def nodes(self) -> tuple:
        """(serial, its parent's serial, positions its key covers, its pages, lock count,
        the sum of its children's locks) of every node but the root (serial 1), by
        serial (the snapshot's ``cache_nodes``)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append((n.serial, n.parent.serial, len(n.key), tuple(n.pages), n.lock,
                        sum(c.lock for c in n.children.values())))
            stack.extend(n.children.values())
        return tuple(sorted(out))

    def check_integrity(self) -> None:
        """Keys page aligned, pages one per key page, children keyed by their first page,
        a node's lock at least the sum of its children's, the page count right."""
        count, stack = 0, [self.root]
        while stack:
            n = stack.pop()
            if n is not self.root:
                if not n.key or len(n.key) % self.ps or len(n.pages) != len(n.key) // self.ps:
                    raise AssertionError(f"radix node of {len(n.key)} positions holds "
                                         f"{len(n.pages)} pages (page size {self.ps})")
                if n.lock < 0:
                    raise AssertionError(f"radix node lock {n.lock} < 0")
                count += len(n.pages)
            below = sum(c.lock for c in n.children.values())
            if n is not self.root and n.lock < below:
                raise AssertionError(f"radix node lock {n.lock} below its children's {below}")
            for k, c in n.children.items():
                if c.parent is not n or self._first(c.key) != k:
                    raise AssertionError("radix child linked or keyed wrong")
                stack.append(c)
        if count != self.pages:
            raise AssertionError(f"radix tree counts {self.pages} pages, holds {count}")
