"""A copy of a checkpoint that its script cannot destroy: a reflink where the filesystem
has one (``ioctl FICLONE``: the blocks are shared until either side is written), else a
byte copy.  Never a hard link: ``torch.save`` truncates and rewrites the same inode, so a
link would change with the file.  A folder is copied file by file; the copy is written
under a temporary name in its destination folder and renamed into place when whole, and
keeps the source's mtime (the checkpoint's age)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}


def _copy_file(src: Path, dest: Path) -> bool:
    """``src``'s bytes into the new file ``dest``; True when by reflink."""
    with open(src, "rb") as fin, open(dest, "xb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
            cloned = True
        except OSError as e:
            if e.errno not in _NO_REFLINK:
                raise
            shutil.copyfileobj(fin, fout, 1 << 20)
            cloned = False
        os.fsync(fout.fileno())
    st = os.stat(src)
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    return cloned


def keep_copy(src: Path, dest: Path) -> str:
    """Copy the checkpoint file or folder ``src`` to ``dest`` (which must not exist);
    returns how: "reflink", "copy" or "reflink + copy" (a folder's files went both ways).
    An OSError leaves nothing at ``dest``."""
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, "already there", str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    ways: set[bool] = set()
    if src.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            for dirpath, _dirs, names in os.walk(src):
                rel = Path(dirpath).relative_to(src)
                (tmp / rel).mkdir(parents=True, exist_ok=True)
                for name in names:
                    ways.add(_copy_file(Path(dirpath) / name, tmp / rel / name))
            st = os.stat(src)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.rename(tmp, dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    else:
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
        os.close(fd)
        os.unlink(name)  # _copy_file creates it exclusively (O_EXCL)
        try:
            ways.add(_copy_file(src, Path(name)))
            os.rename(name, dest)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
    return " + ".join(w for w, on in (("reflink", True in ways), ("copy", False in ways)) if on) or "copy"
