"""Two local users for the JupyterHub test, made for one test session and removed after it.

Each is an ordinary account (``useradd``: its own group, a home, no login shell) named after
the test's pid; accounts left by a test process that died without removing them (killed) are
removed before new ones are made. The venv's interpreter may live where another uid cannot reach it (a pyenv build
under root's 0700 home): :class:`LocalUsers` then grants each user, by a POSIX ACL entry, only
the search (``x``) permission on each such folder, and removes those entries before the users
go. Nothing else on the host is changed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass

import psutil

PREFIX = "mxhub"  # then the creating process's pid, "x", a random tag and a letter


@dataclass(frozen=True)
class LocalUser:
    """An account made by :class:`LocalUsers`."""

    name: str
    uid: int
    gid: int
    home: str


def _folders_to_reach() -> list[str]:
    """Every folder above the interpreter, the venv and this repository, each folder once."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    targets = {os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, repo}
    folders: set[str] = set()
    for target in targets:
        folder = os.path.dirname(target) if os.path.isfile(target) else target
        while True:
            folders.add(folder)
            if folder == os.path.dirname(folder):
                break
            folder = os.path.dirname(folder)
    return sorted(folders)


def _closed_to_others(folder: str) -> bool:
    """Whether other users lack the search permission on ``folder``."""
    return not stat.S_IMODE(os.stat(folder).st_mode) & stat.S_IXOTH


def processes_of(uids: set[int]) -> list[psutil.Process]:
    """The live processes whose real uid is one of ``uids``."""
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        info = proc.info
        if info["uids"] is not None and info["uids"].real in uids and info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _remove_owned_by(uids: set[int], folders: list[str]) -> None:
    """Remove what ``uids`` left at the top of ``folders`` (a cluster's private folders)."""
    for folder in folders:
        owned = []
        with os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):  # another's file, removed meanwhile
                    if entry.stat(follow_symlinks=False).st_uid in uids:
                        owned.append(entry)
        for entry in owned:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


class LocalUsers:
    """``with LocalUsers(2) as users``: that many new accounts, gone at the end with every
    process they run, their homes and what they left in /tmp and /dev/shm."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.users: list[LocalUser] = []
        self.opened: list[str] = []  # the folders given an ACL entry for each user
        self.acls: dict[str, str] = {}  # their ACLs before, restored whole afterwards

    def __enter__(self) -> list[LocalUser]:
        remove_stale()
        try:
            tag = f"{PREFIX}{os.getpid()}x{secrets.token_hex(1)}"
            for i in range(self.count):
                name = f"{tag}{chr(ord('a') + i)}"
                subprocess.run(
                    ["useradd", "--create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
                    check=True,
                    capture_output=True,
                )
                entry = pwd.getpwnam(name)
                self.users.append(LocalUser(name, entry.pw_uid, entry.pw_gid, entry.pw_dir))
            self.opened = [folder for folder in _folders_to_reach() if _closed_to_others(folder)]
            for folder in self.opened:
                self.acls[folder] = subprocess.run(
                    ["getfacl", "--omit-header", "--absolute-names", folder], check=True, capture_output=True, text=True
                ).stdout
                for user in self.users:
                    subprocess.run(["setfacl", "-m", f"u:{user.name}:x", folder], check=True, capture_output=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.users

    def __exit__(self, *exc: object) -> None:
        _remove([(user.name, user.uid) for user in self.users], self.opened)
        for folder, acl in self.acls.items():  # removing an entry leaves a mask entry behind
            subprocess.run(["setfacl", "--set-file=-", folder], input=acl, text=True, check=False, capture_output=True)
        self.users, self.acls = [], {}


def _remove(users: list[tuple[str, int]], opened: list[str]) -> None:
    """Kill every process of ``users`` (name, uid) by pid, remove their ACL entries on
    ``opened``, what they left in /tmp and /dev/shm, and the accounts with their homes."""
    uids = {uid for _, uid in users}
    deadline = time.monotonic() + 10.0
    while (left := processes_of(uids)) and time.monotonic() < deadline:
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=2)
    for folder in opened:
        for name, _ in users:
            subprocess.run(["setfacl", "-x", f"u:{name}", folder], check=False, capture_output=True)
    _remove_owned_by(uids, ["/tmp", "/dev/shm"])
    for name, _ in users:
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def remove_stale() -> None:
    """Remove the accounts that a test process no longer running made."""
    stale = []
    for entry in pwd.getpwall():
        made_by = re.fullmatch(rf"{PREFIX}(\d+)x[0-9a-f]+[a-z]", entry.pw_name)
        if made_by and not psutil.pid_exists(int(made_by.group(1))):
            stale.append((entry.pw_name, entry.pw_uid))
    if stale:
        _remove(stale, [folder for folder in _folders_to_reach() if _closed_to_others(folder)])
