"""The CPU tree of :mod:`nri_balloons.cputree`, flattened for its max-local-set step.

:func:`flat_tree` is :meth:`nri_framework.topology.Topology.tree` in preorder, as
tuples of CPU masks and per-node facts (cached per topology); with
``prefer_spread_on_physical_cores`` every NUMA node is split into classes by thread
index (``<numa>class<k>``), as upstream's ``SplitLevel``.
"""

from __future__ import annotations

import weakref

import msgspec
from nri_framework.topology import Topology, TreeNode

__all__ = ["FlatTree", "drop_trivial_levels", "flat_tree", "flatten"]


class FlatTree(msgspec.Struct, frozen=True):
    """The CPU tree in preorder. ``end[i]`` is the index after node ``i``'s subtree;
    ``parent`` of the root is ``len(masks)`` (a slot holding the empty path)."""

    masks: tuple[int, ...]
    sizes: tuple[int, ...]
    depth: tuple[int, ...]
    parent: tuple[int, ...]
    end: tuple[int, ...]
    names: tuple[str, ...]
    rank: tuple[int, ...]
    """Position of the node's name in ascending order of the distinct names."""
    base: tuple[int, ...]
    """Lowest CPU of the node."""
    rel: tuple[int, ...]
    """The node's CPUs shifted down by its ``base``."""
    shift: tuple[int, ...]
    """``base`` minus the parent's ``base`` (the root's own ``base``)."""
    leaves: tuple[tuple[tuple[int, int], ...], ...]
    """For a node whose children are all leaves: ``(1 << (cpu - base), child)`` of
    each child in ascending name order; empty for other nodes."""


def flatten(root: TreeNode, classes: dict[int, int] | None) -> FlatTree:
    masks: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    end: list[int] = []
    names: list[str] = []

    def add(name: str, mask: int, d: int, par: int) -> int:
        masks.append(mask)
        depth.append(d)
        parent.append(par)
        end.append(0)
        names.append(name)
        return len(masks) - 1

    def visit(node: TreeNode, d: int, par: int, class_mask: int) -> None:
        mask = node.cpus & class_mask
        if not mask:
            return  # masked out by a class split: cut the branch
        i = add(node.name, mask, d, par)
        if classes is not None and node.level == "numa" and class_mask == -1:
            for k in sorted(classes):
                cmask = mask & classes[k]
                if not cmask:
                    continue
                j = add(f"{node.name}class{k}", cmask, d + 1, i)
                for child in node.children:
                    visit(child, d + 2, j, classes[k])
                end[j] = len(masks)
        else:
            for child in node.children:
                visit(child, d + 1, i, class_mask)
        end[i] = len(masks)

    visit(root, 0, -1, -1)
    masks, depth, parent, end, names = drop_trivial_levels(masks, depth, parent, end, names)
    n = len(masks)
    parent[0] = n
    # Dense ranks: the copies of a node in the classes of a split share its name,
    # and a full tie goes to the first node in preorder.
    order = {name: r for r, name in enumerate(sorted(set(names)))}
    rank = [order[name] for name in names]
    base = [(m & -m).bit_length() - 1 for m in masks]
    shift = [base[i] - (base[parent[i]] if i else 0) for i in range(n)]
    leaves: list[tuple[tuple[int, int], ...]] = [()] * n
    for i in range(n):
        kids = []
        j = i + 1
        while j < end[i]:
            kids.append(j)
            j = end[j]
        if kids and all(end[k] == k + 1 for k in kids):
            kids.sort(key=rank.__getitem__)
            leaves[i] = tuple((1 << (base[k] - base[i]), k) for k in kids)
    return FlatTree(
        masks=tuple(masks),
        sizes=tuple(m.bit_count() for m in masks),
        depth=tuple(depth),
        parent=tuple(parent),
        end=tuple(end),
        names=tuple(names),
        rank=tuple(rank),
        base=tuple(base),
        rel=tuple(m >> b for m, b in zip(masks, base, strict=True)),
        shift=tuple(shift),
        leaves=tuple(leaves),
    )


def drop_trivial_levels(
    masks: list[int], depth: list[int], parent: list[int], end: list[int], names: list[str]
) -> tuple[list[int], list[int], list[int], list[int], list[str]]:
    """Remove every tree level (but the root) whose nodes all have one child with
    the same CPUs: an L2 cache holding one core, a core with one thread, the copies
    of both in a class split. Such a node passes the max-local-set filter exactly
    when its child does, and the child is deeper, so it can never be chosen; the
    removed count is the same for all nodes of the level, so the order of the
    remaining nodes does not change either."""
    n = len(masks)
    single_same = [
        end[i] > i + 1 and end[i + 1] == end[i] and masks[i + 1] == masks[i] for i in range(n)
    ]
    trivial: set[int] = set()
    for d in range(1, max(depth) + 1):
        level = [i for i in range(n) if depth[i] == d]
        if level and all(single_same[i] for i in level):
            trivial.add(d)
    if not trivial:
        return masks, depth, parent, end, names
    kept_before = [0] * (n + 1)
    for i in range(n):
        kept_before[i + 1] = kept_before[i] + (depth[i] not in trivial)
    new: tuple[list[int], list[int], list[int], list[int], list[str]] = ([], [], [], [], [])
    for i in range(n):
        d = depth[i]
        if d in trivial:
            continue
        p = parent[i]
        while p >= 0 and depth[p] in trivial:
            p = parent[p]
        new[0].append(masks[i])
        new[1].append(d - sum(1 for t in trivial if t < d))
        new[2].append(kept_before[p] if p >= 0 else -1)
        new[3].append(kept_before[end[i]])
        new[4].append(names[i])
    return new


_TREES: weakref.WeakKeyDictionary[Topology, dict[bool, FlatTree]] = weakref.WeakKeyDictionary()


def flat_tree(topology: Topology, spread: bool) -> FlatTree:
    per_topology = _TREES.setdefault(topology, {})
    tree = per_topology.get(spread)
    if tree is None:
        classes: dict[int, int] | None = None
        if spread:
            # SplitLevel(numa) by the thread's index among its core's threads.
            classes = {}
            for info in topology.cpus.values():
                classes[info.thread] = classes.get(info.thread, 0) | 1 << info.id
        tree = per_topology[spread] = flatten(topology.tree(), classes)
    return tree
