"""A throw-away PostgreSQL cluster for the tests that need a real one (the shared store,
``MT_DATABASE_URL``): initdb in a temporary directory, started on a free local port with
trust authentication and without fsync, stopped and deleted at the end of the session.

PostgreSQL refuses to run as root: as root the cluster runs as the ``postgres`` user (Debian's
``postgresql`` package creates it; ``.ci/run`` installs it). ``MT_TEST_POSTGRES_URL`` names an
existing server instead (its user must be allowed to create databases). Where neither works,
the tests that need it skip with the reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

from tests.live_server import free_port


def _binaries() -> str | None:
    """The directory of ``initdb`` and ``pg_ctl``, newest version first."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(found))
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(directory, "initdb")):
            return directory
    return None


def _as_user() -> tuple[list[str], int | None]:
    """The command prefix that runs the server's tools as a user PostgreSQL accepts, and that
    user's id where it is not us."""
    if os.geteuid() != 0:
        return [], None
    try:
        postgres = pwd.getpwnam("postgres")
    except KeyError as error:
        raise RuntimeError("running as root and there is no 'postgres' user") from error
    runner = shutil.which("runuser") or shutil.which("su")
    if runner is None:
        raise RuntimeError("running as root and neither runuser nor su is available")
    if runner.endswith("runuser"):
        return [runner, "-u", "postgres", "--"], postgres.pw_uid
    return ["su", "postgres", "-s", "/bin/sh", "-c"], postgres.pw_uid


@contextlib.contextmanager
def local_cluster() -> Iterator[str]:
    """Start a cluster; yields the URL of its ``postgres`` database (RuntimeError: none)."""
    binaries = _binaries()
    if binaries is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    prefix, uid = _as_user()
    root = tempfile.mkdtemp(prefix="mtserve-pg-")
    if uid is not None:
        os.chown(root, uid, -1)
    data = os.path.join(root, "data")
    port = free_port()

    def run(*args: str) -> None:
        command = [os.path.join(binaries, args[0]), *args[1:]]
        if prefix[:1] == ["su"]:
            command = [*prefix, " ".join(f"'{part}'" for part in command)]
        else:
            command = [*prefix, *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root)
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {result.stderr.strip()[-500:]}")

    try:
        run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        run("pg_ctl", "-D", data, "-o", options, "-l", os.path.join(root, "log"), "-w", "start")
    except Exception:
        shutil.rmtree(root, ignore_errors=True)
        raise
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        with contextlib.suppress(Exception):
            run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def server() -> Iterator[str]:
    """``MT_TEST_POSTGRES_URL``, or a local cluster started now."""
    if url := os.environ.get("MT_TEST_POSTGRES_URL"):
        yield url
        return
    with local_cluster() as url:
        yield url


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server; yields its URL and drops it afterwards."""
    import psycopg

    name = f"mtserve_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
