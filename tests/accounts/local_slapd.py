"""A private OpenLDAP server (Debian's slapd) for the LDAP sign-in tests.

Its own slapd.conf, mdb database and socket in a temporary directory, on a free port
(or LABPORTAL_TEST_LDAP_PORT), seeded with slapadd before it starts; the system's slapd
service is never used.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SLAPD = "/usr/sbin/slapd"
SUFFIX = "dc=lab,dc=example"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "admin-secret"


def missing() -> str:
    for tool in (SLAPD, shutil.which("slapadd") or "/usr/sbin/slapadd", shutil.which("ldapmodify")):
        if not tool or not os.access(tool, os.X_OK):
            return "slapd and ldap-utils (apt-get install slapd ldap-utils)"
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalSlapd:
    def __init__(self, seed_ldif: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="labportal-slapd-"))
        self.port = int(os.environ.get("LABPORTAL_TEST_LDAP_PORT") or _free_port())
        self.uri = f"ldap://127.0.0.1:{self.port}"
        self.seed_ldif = seed_ldif
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.dir / "db").mkdir()
        conf = self.dir / "slapd.conf"
        conf.write_text(
            "\n".join(
                [
                    "include /etc/ldap/schema/core.schema",
                    "include /etc/ldap/schema/cosine.schema",
                    "include /etc/ldap/schema/inetorgperson.schema",
                    "include /etc/ldap/schema/nis.schema",
                    f"pidfile {self.dir}/slapd.pid",
                    "modulepath /usr/lib/ldap",
                    "moduleload back_mdb",
                    "database mdb",
                    "maxsize 10485760",
                    f"suffix {SUFFIX}",
                    f"rootdn {ROOT_DN}",
                    f"rootpw {ROOT_PASSWORD}",
                    f"directory {self.dir}/db",
                    "access to attrs=userPassword by anonymous auth by self write by * none",
                    "access to * by * read",
                    "",
                ]
            )
        )
        seed = self.dir / "seed.ldif"
        seed.write_text(self.seed_ldif)
        slapadd = shutil.which("slapadd") or "/usr/sbin/slapadd"
        subprocess.run([slapadd, "-f", str(conf), "-l", str(seed)], check=True, capture_output=True)
        self.process = subprocess.Popen(
            [SLAPD, "-d", "0", "-f", str(conf), "-h", self.uri],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"slapd exited: {err[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"slapd did not listen on {self.uri}")

    def modify(self, ldif: str) -> None:
        subprocess.run(
            ["ldapmodify", "-x", "-H", self.uri, "-D", ROOT_DN, "-w", ROOT_PASSWORD],
            input=ldif.encode(),
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
