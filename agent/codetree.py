"""The tree a workdir archive unpacks to, as names only (agent/code.py's check).

Where each member lands once the links the archive made before it are
followed, as the file system follows them. Links that each stay inside on
their own can lead out through one another (d -> ., d/e -> ..), and members
can clash (a file where a directory is): both are found here without writing
a file, so an upload is checked at the cost of reading it.

The tree is kept as nodes, one per name, and a path is walked a component at
a time: kept as strings, every directory above each member was a string of
its own, and a 1 KB archive of links whose targets are thousands of
components deep took gigabytes and minutes to check. What a walk may do is
bounded as the kernel bounds it (40 links followed), how deep it may lead
(MAX_DEPTH), and how many names the tree may hold (MAX_NODES).
"""
from __future__ import annotations

import posixpath
import tarfile
from collections import deque

MAX_HOPS = 40           # links followed in one walk: the kernel's own bound (ELOOP)
MAX_DEPTH = 256         # directories deep, through links too (agent/code.py MAX_NAME_DEPTH)
MAX_NODES = 250_000     # files, directories and links, with the directories links lead into


class TreeError(Exception):
    """The archive cannot unpack safely: why, naming the member."""


class _Node:
    __slots__ = ("children", "link")

    def __init__(self, children: dict[str, _Node] | None = None, link: str | None = None) -> None:
        self.children = children  # a directory's entries; None for a file or a link
        self.link = link          # a link's target as written

    @property
    def is_file(self) -> bool:
        return self.children is None and self.link is None


Walk = list[tuple[str, "_Node | None"]]  # from the root: each component and its node (None: not made yet)


class Tree:
    def __init__(self) -> None:
        self.root = _Node(children={})
        self.nodes = 1

    def _walk(self, name: str, member: str) -> Walk | None:
        """`name` with every link in it followed; None when it leads out or loops."""
        walk: Walk = [("", self.root)]
        pending = deque(p for p in name.split("/") if p not in ("", "."))
        hops = 0
        while pending:
            part = pending.popleft()
            if part == "..":
                if len(walk) == 1:
                    return None
                walk.pop()
                continue
            node = walk[-1][1]
            child = node.children.get(part) if node is not None and node.children is not None else None
            if child is not None and child.link is not None:
                hops += 1
                if hops > MAX_HOPS:
                    return None
                pending.extendleft(reversed([p for p in child.link.split("/") if p not in ("", ".")]))
                continue
            walk.append((part, child))
            if len(walk) > MAX_DEPTH + 1:
                raise TreeError(f"{member!r}: leads more than {MAX_DEPTH} directories deep through its links")
        return walk

    def _made(self, walk: Walk, member: str) -> _Node:
        """The directory at the end of `walk`, each one on the way made unless a file is there."""
        node = self.root
        for i, (part, _) in enumerate(walk[1:], start=1):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = self._new(_Node(children={}), member)
            elif child.children is None:
                raise TreeError(f"{member!r}: under {'/'.join(p for p, _ in walk[1:i + 1])!r}, which is a file")
            node = child
        return node

    def _new(self, node: _Node, member: str) -> _Node:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise TreeError(f"{member!r}: the archive makes more than {MAX_NODES} files, directories and links "
                            "(counting the directories its links lead into)")
        return node

    def add(self, member: tarfile.TarInfo) -> None:
        name = posixpath.normpath(member.name)
        where = self._walk(posixpath.dirname(name), member.name)
        if where is None:
            raise TreeError(f"{member.name!r}: leads out of the working directory through a link")
        parent = self._made(where, member.name)
        base = posixpath.basename(name)
        if member.issym():
            here = parent.children.get(base)
            if here is not None and here.children is not None:
                raise TreeError(f"{member.name!r}: a link where the archive made a directory")
            parent.children[base] = _Node(link=member.linkname) if here is not None else \
                self._new(_Node(link=member.linkname), member.name)
            if self._walk(posixpath.join(posixpath.dirname(name), member.linkname), member.name) is None:
                raise TreeError(f"{member.name!r}: a link that leads out of the working directory through "
                                f"another ({member.linkname!r})")
            return
        directory, last, there = parent, base, parent.children.get(base)
        if base in ("", ".") or (there is not None and there.link is not None):  # written through the link
            final = self._walk(name, member.name)
            if final is None or len(final) == 1:
                raise TreeError(f"{member.name!r}: leads out of the working directory through a link")
            directory = self._made(final[:-1], member.name)
            last = final[-1][0]
            there = directory.children.get(last)
        kind, found = ("d" if member.isdir() else "f"), None if there is None else "f" if there.is_file else "d"
        if kind == "d" and found == "f":
            return  # tar leaves the file as it is (what goes under it is refused)
        if (found or kind) != kind or (member.islnk() and there is not None):
            raise TreeError(f"{member.name!r}: where the archive made a {'directory' if kind == 'f' else 'file'} "
                            "already")
        if member.islnk() and self._walk(member.linkname, member.name) is None:
            raise TreeError(f"{member.name!r}: a hard link that leads out through a link ({member.linkname!r})")
        if there is None:
            directory.children[last] = self._new(_Node(children={} if kind == "d" else None), member.name)
