"""Crash states of a file tree from an strace of the real programs.

Used by bench/crash-replay.py. A workload runs under
`strace -f -xx -s 16M` with the file-system calls traced (STRACE_CALLS);
`parse` turns the trace into an ordered list of operations on a model
file system (inodes with contents, names in folders, open file
descriptions, per-process descriptor tables, threads sharing them), and
`CrashStates` builds the file tree a power cut would leave at any point
of that list, under a stated model of what a file system keeps:

- Names (create, link, rename, unlink, mkdir, rmdir) are kept in the
  order they were made, as a journaling file system (ext4, XFS) commits
  its metadata: a cut keeps every name change up to some point. Every
  change made before an `fsync` of a folder (or a `syncfs`) started is
  kept once that sync returned; past that, any prefix of the rest.
- A file's data (write, truncate, punched holes, its size) is kept once
  an `fsync`/`fdatasync` of that file (or a `syncfs`) that started after
  the write returned. Past that, each write is lost, kept, or torn (a
  random subset of its 512-byte sectors written, the file size as if it
  were whole, the rest zeroes), independently of the order of writes.
- Modification times, locks and reads are not modelled.

Only paths under the traced root are modelled; files elsewhere (inputs,
outputs) are followed through their descriptors but never kept.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field

STRACE_CALLS = (
    "open,openat,creat,mkdir,mkdirat,write,pwrite64,writev,pwritev,pwritev2,"
    "lseek,ftruncate,truncate,fallocate,rename,renameat,renameat2,link,linkat,"
    "unlink,unlinkat,rmdir,fsync,fdatasync,syncfs,sync,close,dup,dup2,dup3,"
    "fcntl,clone,clone3,fork,vfork,execve,chdir,copy_file_range,sendfile"
)

SECTOR = 512
# the folder the root is in (outside the model): its fsync makes the root's
# own name durable
ROOT_PARENT = 0

# ---------------------------------------------------------------- parsing


class TraceError(Exception):
    pass


def _parse_args(s: str, i: int = 0):
    """Parse strace's argument syntax from s[i:]; returns (values, end)."""
    out = []
    n = len(s)
    while i < n:
        c = s[i]
        if c in " ,":
            i += 1
        elif c in ")]}":
            return out, i
        elif c == '"':
            j = s.index('"', i + 1)
            raw = s[i + 1 : j]
            out.append(bytes.fromhex(raw.replace("\\x", "")))
            i = j + 1
            if s.startswith("...", i):
                raise TraceError("a string was cut short: raise strace -s")
        elif c == "[":
            vals, j = _parse_args(s, i + 1)
            out.append(vals)
            i = j + 1
        elif c == "{":
            vals, j = _parse_args(s, i + 1)
            out.append(vals)
            i = j + 1
        else:
            m = re.compile(r"[^,)\]}]+").match(s, i)
            tok = m.group(0).strip()
            # key=value inside structs: keep the value
            if "=" in tok and not tok.startswith("="):
                k, v = tok.split("=", 1)
                if v.startswith('"') or v.startswith("[") or v.startswith("{"):
                    vals, j = _parse_args(s, i + len(k) + 1)
                    out.append((k, vals[0] if vals else None))
                    i = j
                    continue
                tok = (k, v)
            out.append(tok)
            i = m.end()
    return out, i


LINE = re.compile(r"^(\d+)\s+(.*)$")
CALL = re.compile(r"^(\w+)\((.*)$")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
RESULT = re.compile(r"^(.*)\)\s+= (-?\d+|\?|0x[0-9a-f]+)(?: (\w+))?.*$", re.S)


@dataclass
class Call:
    tid: int
    name: str
    args: list
    ret: int  # -1 on error
    start: int  # the trace line the call started on
    end: int  # the trace line it returned on


def read_calls(path: str, only: tuple[str, ...] | None = None):
    """The completed calls of an strace -f -xx log, in completion order,
    and the process exits (tid, status); with `only`, only those calls."""
    pending: dict[tuple[int, str], tuple[str, int]] = {}
    lineno = 0
    with open(path, "r", encoding="ascii", errors="replace") as f:
        for line in f:
            lineno += 1
            line = line.rstrip("\n")
            m = LINE.match(line)
            if not m:
                continue
            tid = int(m.group(1))
            rest = m.group(2)
            if rest.startswith("+++ exited with "):
                yield ("exit", tid, int(rest.split()[3]))
                continue
            if rest.startswith("+++ killed by"):
                yield ("exit", tid, 128)
                continue
            if rest.startswith("---"):
                continue
            rm = RESUMED.match(rest)
            if rm:
                name = rm.group(1)
                pend = pending.pop((tid, name), ("", lineno))
                if pend is None:
                    continue  # a close, applied where it started
                head, start = pend
                text = head + rm.group(2)
            else:
                cm = CALL.match(rest)
                if not cm:
                    continue
                name = cm.group(1)
                if rest.endswith("<unfinished ...>"):
                    head = cm.group(2)[: -len("<unfinished ...>")]
                    if name == "close":
                        # a descriptor is free as soon as close starts: another
                        # thread's open may return that number before this
                        # close returns
                        if only is None or name in only:
                            args, _ = _parse_args(head)
                            yield ("call", Call(tid, name, args, 0, lineno, lineno))
                        pending[(tid, name)] = None
                        continue
                    pending[(tid, name)] = (head, lineno)
                    continue
                text = cm.group(2)
                start = lineno
            if only is not None and name not in only:
                continue
            r = RESULT.match(text)
            if not r:
                continue  # no result
            ret = r.group(2)
            ret = -1 if ret == "?" else int(ret, 0)
            args, _ = _parse_args(r.group(1))
            yield ("call", Call(tid, name, args, ret, start, lineno))


# ------------------------------------------------------------ the model


@dataclass
class Inode:
    ino: int
    is_dir: bool


@dataclass
class Ofd:
    """An open file description."""

    path: str | None  # where it was opened (folders: where it is now, see dir_path)
    ino: int | None  # None: outside the root
    offset: int = 0
    append: bool = False


@dataclass
class Op:
    """One change to the modelled tree, in completion order."""

    kind: str  # 'name', 'data', 'sync', 'syncfs'
    ino: int | None = None  # data/sync target
    start: int = 0  # sync: number of ops completed when it started
    # name ops: ('create', path, ino, is_dir) ('unlink', path) ('rename', src, dst, ino)
    # data ops: ('write', off, bytes) ('trunc', len) ('punch', off, len)
    what: tuple = ()
    # name ops: the folder whose sync makes the new name durable, and the
    # one whose sync makes the old name's removal durable (POSIX model)
    adds_in: int | None = None
    removes_in: int | None = None


@dataclass
class Ack:
    at: int  # ops completed when it reported (first stdout line, else its exit)
    argv: list[str]
    status: int


class Model:
    def __init__(self, root: str, cwd: str):
        self.root = os.path.normpath(root)
        self.cwd = cwd
        self.names: dict[str, int] = {}  # path -> ino (live)
        self.inodes: dict[int, Inode] = {ROOT_PARENT: Inode(ROOT_PARENT, True)}
        self.next_ino = 1
        self.ops: list[Op] = []
        self.tables: dict[int, dict[int, Ofd]] = {}  # tid -> shared fd table
        self.leader: dict[int, int] = {}  # tid -> process leader tid
        self.argv: dict[int, list[str]] = {}  # leader -> argv
        self.acks: list[Ack] = []
        self.execs: list[tuple[int, list[str]]] = []  # (ops done, argv) at each execve
        self.first_out: dict[int, int] = {}  # process -> ops done at its first stdout write
        self.initial_data: dict[int, bytes] = {}
        self.initial_names: dict[str, int] = {}
        self.op_lines: list[int] = []  # the trace line each op returned on
        self.clones: dict[int, tuple[int, str]] = {}  # child -> (parent, flags)

    # -- the tree before the workload
    def load_initial(self):
        if not os.path.isdir(self.root):
            self.initial_names = {}
            return
        self.names[self.root] = self._new_inode(True)
        for d, dirs, files in os.walk(self.root):
            for name in sorted(dirs):
                self.names[os.path.join(d, name)] = self._new_inode(True)
            for name in sorted(files):
                p = os.path.join(d, name)
                ino = self._new_inode(False)
                self.names[p] = ino
                with open(p, "rb") as f:
                    self.initial_data[ino] = f.read()
        self.initial_names = dict(self.names)

    def _new_inode(self, is_dir: bool) -> int:
        ino = self.next_ino
        self.next_ino += 1
        self.inodes[ino] = Inode(ino, is_dir)
        return ino

    def inside(self, p: str) -> bool:
        return p == self.root or p.startswith(self.root + "/")

    def dir_path(self, ino: int) -> str | None:
        for p, i in self.names.items():
            if i == ino:
                return p
        return None

    def resolve(self, tid: int, dirfd, rel: bytes) -> str:
        rel = rel.decode("utf-8", "surrogateescape")
        if rel.startswith("/"):
            return os.path.normpath(rel)
        if dirfd in (None, "AT_FDCWD"):
            base = self.cwd
        else:
            ofd = self.table(tid).get(int(dirfd))
            if ofd is None:
                raise TraceError(f"tid {tid}: unknown descriptor {dirfd}")
            base = ofd.path
            if ofd.ino is not None and self.inodes[ofd.ino].is_dir:
                base = self.dir_path(ofd.ino) or base
        return os.path.normpath(os.path.join(base, rel)) if rel else base

    def table(self, tid: int) -> dict[int, Ofd]:
        t = self.tables.get(tid)
        if t is None:
            # a thread or process seen before its parent's clone returned
            parent, flags = self.clones.get(tid, (None, ""))
            if parent is None:
                t = {}
            elif "CLONE_FILES" in flags:
                t = self.table(parent)
            else:
                t = dict(self.table(parent))
            self.tables[tid] = t
            if parent is not None:
                self.leader[tid] = self.leader.get(parent, parent) if "CLONE_THREAD" in flags else tid
        return t

    # -- operations
    def _parent(self, path: str) -> int | None:
        parent = os.path.dirname(path)
        if parent == os.path.dirname(self.root):
            return ROOT_PARENT
        return self.names.get(parent)

    def _name(self, *what):
        if what[0] == "create":
            add, rm = self._parent(what[1]), None
        elif what[0] == "unlink":
            add, rm = None, self._parent(what[1])
        else:
            add, rm = self._parent(what[2]), self._parent(what[1])
        self.ops.append(Op("name", what=what, adds_in=add, removes_in=rm))

    def _data(self, ino, *what):
        self.ops.append(Op("data", ino=ino, what=what))

    def _open(self, tid, path, flags: str, ret):
        tab = self.table(tid)
        fl = set(flags.split("|"))
        if path == os.path.dirname(self.root):
            tab[ret] = Ofd(path, ROOT_PARENT)  # its sync makes the root's name durable
            return
        if not self.inside(path):
            tab[ret] = Ofd(path, None, 0, "O_APPEND" in fl)
            return
        if "O_TMPFILE" in fl:
            ino = self._new_inode(False)
            tab[ret] = Ofd(path, ino)
            return
        ino = self.names.get(path)
        if ino is not None and "O_EXCL" in fl and "O_CREAT" in fl:
            raise TraceError(f"{path} was created (O_EXCL) but the model has it already")
        if ino is None:
            if "O_CREAT" not in fl:
                raise TraceError(f"open of {path} succeeded but the model has no such file")
            ino = self._new_inode("O_DIRECTORY" in fl)
            self.names[path] = ino
            self._name("create", path, ino, False)
        elif "O_TRUNC" in fl:
            self._data(ino, "trunc", 0)
        tab[ret] = Ofd(path, ino, 0, "O_APPEND" in fl)

    def _write(self, ofd: Ofd, data: bytes, off: int | None):
        if off is None:
            if ofd.append:
                off = -1  # at the end (resolved when applied)
            else:
                off = ofd.offset
            ofd.offset = (off if off >= 0 else 0) + len(data)
        if ofd.ino is not None:
            self._data(ofd.ino, "write", off, data)

    def apply(self, c: Call):
        if c.ret < 0:
            return
        tid, a = c.tid, c.args
        n = c.name
        tab = self.table(tid)
        if n in ("clone", "clone3", "fork", "vfork"):
            self.table(c.ret)  # made from the parent's (see `clones`)
        elif n == "execve":
            argv = [x.decode("utf-8", "replace") for x in a[1] if isinstance(x, bytes)]
            self.argv[self.leader.get(tid, tid)] = argv
            self.first_out.pop(self.leader.get(tid, tid), None)
            self.execs.append((len(self.ops), argv))
        elif n == "chdir":
            self.cwd = self.resolve(tid, None, a[0])
        elif n in ("open", "creat"):
            flags = a[1] if n == "open" else "O_CREAT|O_WRONLY|O_TRUNC"
            self._open(tid, self.resolve(tid, None, a[0]), flags, c.ret)
        elif n == "openat":
            self._open(tid, self.resolve(tid, a[0], a[1]), a[2], c.ret)
        elif n in ("mkdir", "mkdirat"):
            p = self.resolve(tid, None, a[0]) if n == "mkdir" else self.resolve(tid, a[0], a[1])
            if self.inside(p):
                ino = self._new_inode(True)
                self.names[p] = ino
                self._name("create", p, ino, True)
        elif n == "write":
            ofd = tab.get(int(a[0]))
            if ofd is not None:
                self._write(ofd, a[1][: c.ret], None)
        elif n == "pwrite64":
            ofd = tab.get(int(a[0]))
            if ofd is not None:
                self._write(ofd, a[1][: c.ret], int(a[3]))
        elif n in ("writev", "pwritev", "pwritev2"):
            ofd = tab.get(int(a[0]))
            if ofd is not None:
                data = b"".join(v[0][1] if isinstance(v[0], tuple) else v[0] for v in a[1])
                self._write(ofd, data[: c.ret], None if n == "writev" else int(a[3]))
        elif n == "lseek":
            ofd = tab.get(int(a[0]))
            if ofd is not None:
                ofd.offset = c.ret
        elif n == "ftruncate":
            ofd = tab.get(int(a[0]))
            if ofd is not None and ofd.ino is not None:
                self._data(ofd.ino, "trunc", int(a[1]))
        elif n == "truncate":
            p = self.resolve(tid, None, a[0])
            if self.inside(p):
                self._data(self.names[p], "trunc", int(a[1]))
        elif n == "fallocate":
            ofd = tab.get(int(a[0]))
            if ofd is not None and ofd.ino is not None:
                mode, off, ln = a[1], int(a[2]), int(a[3])
                if "COLLAPSE_RANGE" in mode or "INSERT_RANGE" in mode:
                    raise TraceError(f"fallocate {mode} is not modelled")
                if "FALLOC_FL_PUNCH_HOLE" in mode or "FALLOC_FL_ZERO_RANGE" in mode:
                    self._data(ofd.ino, "punch", off, ln, "KEEP_SIZE" not in mode)
                elif "KEEP_SIZE" not in mode:
                    self._data(ofd.ino, "extend", off + ln)
        elif n in ("rename", "renameat", "renameat2"):
            if n == "rename":
                src, dst = self.resolve(tid, None, a[0]), self.resolve(tid, None, a[1])
            else:
                src, dst = self.resolve(tid, a[0], a[1]), self.resolve(tid, a[2], a[3])
            if n == "renameat2" and len(a) > 4 and ("EXCHANGE" in a[4] or "WHITEOUT" in a[4]):
                if self.inside(src) or self.inside(dst):
                    raise TraceError(f"renameat2 {a[4]} is not modelled")
            if self.inside(src) or self.inside(dst):
                if not self.inside(src) or not self.inside(dst):
                    raise TraceError(f"rename across the root's edge: {src} -> {dst}")
                ino = self.names[src]
                _move(self.names, src, dst, keep=False, replace=not self.inodes[ino].is_dir)
                self._name("rename", src, dst, ino)
        elif n in ("link", "linkat"):
            if n == "link":
                src, dst, ino = self.resolve(tid, None, a[0]), self.resolve(tid, None, a[1]), None
            else:
                dst = self.resolve(tid, a[2], a[3])
                flags = a[4]
                ino = None
                if "AT_EMPTY_PATH" in flags and a[1] == b"":
                    ino = tab[int(a[0])].ino
                    src = None
                else:
                    src = self.resolve(tid, a[0], a[1])
                    m = re.match(r"^/proc/self/fd/(\d+)$", src)
                    if m:
                        ino = tab[int(m.group(1))].ino
                        src = None
            if ino is None and src is not None and self.inside(src):
                ino = self.names[src]
            if self.inside(dst):
                if ino is None:
                    raise TraceError(f"link into the root from outside: {dst}")
                self.names[dst] = ino
                self._name("create", dst, ino, False)
        elif n in ("unlink", "unlinkat", "rmdir"):
            p = self.resolve(tid, None, a[0]) if n != "unlinkat" else self.resolve(tid, a[0], a[1])
            if self.inside(p):
                self.names.pop(p, None)
                self._name("unlink", p)
        elif n in ("fsync", "fdatasync"):
            ofd = tab.get(int(a[0]))
            if ofd is not None and ofd.ino is not None:
                self.ops.append(Op("sync", ino=ofd.ino, start=self._started(c)))
        elif n in ("syncfs", "sync"):
            self.ops.append(Op("syncfs", start=self._started(c)))
        elif n == "close":
            tab.pop(int(a[0]), None)
        elif n in ("dup", "dup2", "dup3") or (n == "fcntl" and "F_DUPFD" in a[1]):
            src = tab.get(int(a[0]))
            if src is not None:
                tab[c.ret] = src
            else:
                tab.pop(c.ret, None)
        elif n in ("copy_file_range", "sendfile"):
            ofd = tab.get(int(a[2 if n == "copy_file_range" else 0]))
            if ofd is not None and ofd.ino is not None:
                raise TraceError(f"{n} into the root is not modelled")

    def _started(self, c: Call) -> int:
        """The number of operations that had returned when `c` started."""
        return bisect.bisect_left(self.op_lines, c.start)


def _clone_flags(c: Call) -> str:
    items = c.args[0] if c.name == "clone3" and c.args and isinstance(c.args[0], list) else c.args
    for kv in items:
        if isinstance(kv, tuple) and kv[0] == "flags":
            return kv[1]
    return ""


def initial(root: str, cwd: str) -> Model:
    """A model of the tree under `root` as it is now: call it before the
    workload runs."""
    m = Model(root, cwd)
    m.load_initial()
    return m


def parse(trace: str, m: Model) -> Model:
    """`m` (from `initial`, taken before the workload) after the calls in
    `trace`. A command counts as having reported (its `Ack`) at its first
    write to standard output, or at its exit if it wrote nothing there."""
    for ev in read_calls(trace, only=("clone", "clone3", "fork", "vfork")):
        if ev[0] == "call" and ev[1].ret > 0:
            m.clones[ev[1].ret] = (ev[1].tid, _clone_flags(ev[1]))
    for ev in read_calls(trace):
        if ev[0] == "exit":
            _, tid, status = ev
            if m.leader.get(tid, tid) == tid and tid in m.argv:
                at = m.first_out.get(tid, len(m.ops))
                m.acks.append(Ack(min(at, len(m.ops)), m.argv[tid], status))
            continue
        c = ev[1]
        before = len(m.ops)
        if c.name in ("write", "writev") and c.args and c.args[0] == "1" and c.ret > 0:
            m.first_out.setdefault(m.leader.get(c.tid, c.tid), before)
        m.apply(c)
        m.op_lines.extend([c.end] * (len(m.ops) - before))
    return m


# ---------------------------------------------------------- crash states


class CrashStates:
    """The trees a power cut leaves at each point of a model's operations."""

    def __init__(self, m: Model):
        self.m = m
        ops = m.ops
        inf = len(ops) + 1
        self.dur_at = [inf] * len(ops)
        # ops not yet covered by a sync, by target
        pending_data: dict[int, list[int]] = {}
        pending_names: list[int] = []
        pending_all: list[int] = []
        for j, op in enumerate(ops):
            if op.kind == "data":
                pending_data.setdefault(op.ino, []).append(j)
                pending_all.append(j)
            elif op.kind == "name":
                pending_names.append(j)
                pending_all.append(j)
            elif op.kind == "syncfs":
                pending_all = self._cover(pending_all, op.start, j)
            elif op.kind == "sync":
                pending_data[op.ino] = self._cover(pending_data.get(op.ino, []), op.start, j)
                if m.inodes[op.ino].is_dir:
                    pending_names = self._cover(pending_names, op.start, j)
        # a name kept makes every earlier name kept (one ordered journal)
        self.name_idx = [i for i, op in enumerate(ops) if op.kind == "name"]
        # POSIX, each folder on its own: a new name is durable once its
        # folder is synced, an old name's removal once its (old) folder is
        self.add_at = [inf] * len(ops)
        self.rm_at = [inf] * len(ops)
        adds: dict[int, list[int]] = {}
        rms: dict[int, list[int]] = {}
        for j, op in enumerate(ops):
            if op.kind == "name":
                if op.adds_in is not None:
                    adds.setdefault(op.adds_in, []).append(j)
                if op.removes_in is not None:
                    rms.setdefault(op.removes_in, []).append(j)
            elif op.kind == "syncfs" or (op.kind == "sync" and m.inodes[op.ino].is_dir):
                dirs = list(adds) if op.kind == "syncfs" else [op.ino]
                for d in dirs:
                    adds[d] = _cover_into(self.add_at, adds.get(d, []), op.start, j)
                dirs = list(rms) if op.kind == "syncfs" else [op.ino]
                for d in dirs:
                    rms[d] = _cover_into(self.rm_at, rms.get(d, []), op.start, j)

    def _cover(self, pending: list[int], start: int, j: int) -> list[int]:
        return _cover_into(self.dur_at, pending, start, j)

    def points(self) -> list[int]:
        """Every point worth a cut: after each operation (and before the
        first)."""
        return list(range(len(self.m.ops) + 1))

    def state(self, k: int, variant: str, rng: random.Random):
        """(names, contents, isdir) after a cut when ops[:k] had returned.
        variant: 'durable' (nothing unsynced kept), 'all' (everything
        kept: a killed process), 'random' (a random prefix of the unsynced
        name changes, each unsynced write lost, kept or torn), or 'posix'
        (only what was synced, each folder on its own: a new name needs
        its own folder's sync, a removal its old folder's; a rename with
        one of the two is a link or a loss)."""
        ops = self.m.ops
        # names: the kept prefix
        last_durable = -1
        for i in self.name_idx:
            if i >= k:
                break
            if self.dur_at[i] < k:
                last_durable = i
        later = [i for i in self.name_idx if last_durable < i < k]
        if variant in ("all", "posix"):
            cut = k
        elif variant == "durable" or not later:
            cut = last_durable + 1
        else:
            cut = rng.choice([last_durable + 1] + [i + 1 for i in later])
        names = dict(self.m.initial_names)
        isdir = {ino: n.is_dir for ino, n in self.m.inodes.items()}
        data: dict[int, bytearray] = {
            ino: bytearray(b) for ino, b in self.m.initial_data.items()
        }
        for i in range(k):
            op = ops[i]
            if op.kind == "name":
                if i >= cut:
                    continue
                w = op.what
                add = variant != "posix" or self.add_at[i] < k
                rm = variant != "posix" or self.rm_at[i] < k
                if w[0] == "create":
                    if add:
                        names[w[1]] = w[2]
                elif w[0] == "unlink":
                    if rm:
                        names.pop(w[1], None)
                elif w[0] == "rename" and not (add and rm):
                    src, dst = w[1], w[2]
                    # one side only: the new name (a link) or the removal
                    if add and src in names:
                        _move(names, src, dst, keep=True, replace=False)
                    elif add:
                        names[dst] = w[3]  # the inode, whose old name was never durable
                    elif rm:
                        for p in _subtree(names, src):
                            del names[p]
                elif w[0] == "rename":
                    src, dst = w[1], w[2]
                    if src in names:
                        _move(names, src, dst, keep=False, replace=not isdir[names[src]])
            elif op.kind == "data":
                durable = self.dur_at[i] < k
                mode = "apply"
                if not durable:
                    if variant in ("durable", "posix"):
                        continue
                    if variant == "random":
                        mode = rng.choice(("drop", "apply", "torn"))
                        if mode == "drop":
                            continue
                _apply_data(data.setdefault(op.ino, bytearray()), op.what, mode, rng)
        return names, data, isdir


def _subtree(names: dict[str, int], src: str) -> list[str]:
    """`src` and every name under it."""
    return [p for p in names if p == src or p.startswith(src + "/")]


def _move(names: dict[str, int], src: str, dst: str, keep: bool, replace: bool):
    """Give `src` and everything under it the name `dst` (a file over an
    existing `dst` with `replace`); with `keep`, the old names stay too."""
    if replace:
        names.pop(dst, None)
    old = _subtree(names, src)
    moved = {dst + p[len(src) :]: names[p] for p in old}
    if not keep:
        for p in old:
            del names[p]
    names.update(moved)


def _cover_into(dur: list[int], pending: list[int], start: int, j: int) -> list[int]:
    """Mark the ops of `pending` that returned before `start` durable (in
    `dur`) once sync `j` returns; the rest stay pending."""
    keep = []
    for i in pending:
        if i < start:
            dur[i] = min(dur[i], j)
        else:
            keep.append(i)
    return keep


def _apply_data(buf: bytearray, w: tuple, mode: str, rng: random.Random):
    if w[0] == "write":
        off, b = w[1], w[2]
        if off < 0:
            off = len(buf)
        end = off + len(b)
        if len(buf) < end:
            buf.extend(bytes(end - len(buf)))
        if mode == "torn":
            first = off // SECTOR
            last = (end - 1) // SECTOR if b else first - 1
            for s in range(first, last + 1):
                if rng.random() < 0.5:
                    lo, hi = max(off, s * SECTOR), min(end, (s + 1) * SECTOR)
                    buf[lo:hi] = b[lo - off : hi - off]
        else:
            buf[off:end] = b
    elif w[0] == "trunc":
        n = w[1]
        if len(buf) > n:
            del buf[n:]
        else:
            buf.extend(bytes(n - len(buf)))
    elif w[0] == "extend":
        if len(buf) < w[1]:
            buf.extend(bytes(w[1] - len(buf)))
    elif w[0] == "punch":
        off, n, grow = w[1], w[2], w[3]
        end = off + n
        if grow and len(buf) < end:
            buf.extend(bytes(end - len(buf)))
        hi = min(end, len(buf))
        if hi > off:
            buf[off:hi] = bytes(hi - off)


def state_key(names, data, isdir) -> str:
    h = hashlib.sha256()
    for p in sorted(names):
        ino = names[p]
        h.update(p.encode("utf-8", "surrogateescape") + b"\0")
        if isdir[ino]:
            h.update(b"d")
        else:
            h.update(b"f%d:" % ino + hashlib.sha256(bytes(data.get(ino, b""))).digest())
    return h.hexdigest()


def materialize(root: str, names, data, isdir, age: float = 0):
    """Write the tree at `root` (removed first); with `age`, every file
    and folder modified `age` seconds ago."""
    if os.path.lexists(root):
        shutil.rmtree(root)
    first: dict[int, str] = {}
    for p in sorted(names, key=lambda p: (p.count("/"), p)):
        ino = names[p]
        parent = os.path.dirname(p)
        if p != root and not os.path.isdir(parent):
            continue  # its folder's name was lost: unreachable
        if isdir[ino]:
            os.mkdir(p)
        elif ino in first:
            os.link(first[ino], p)
        else:
            with open(p, "wb") as f:
                f.write(data.get(ino, b""))
            first[ino] = p
    if age:
        t = time.time() - age
        for p in sorted(first.values()) + sorted(
            (p for p, i in names.items() if isdir[i] and os.path.isdir(p)), reverse=True
        ):
            os.utime(p, (t, t))
