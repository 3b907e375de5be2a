"""LDAP sign-in against a real, private slapd (tests/accounts/local_slapd.py).

The directory: people under ou=people (ann: uidNumber 20001, in group phd; ben: uidNumber
20002, in group masters), one person outside the search base (ou=guests), posix groups
under ou=groups mapped to categories. Skips where slapd is missing, fails under CI=true.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import Category, User
from labportal.campus_login import ldap_login
from slurm.models import UnixLogin
from tests.accounts import local_slapd
from tests.conftest import require_in_ci

pytestmark = pytest.mark.django_db

S = local_slapd.SUFFIX
SEED = f"""dn: {S}
objectClass: dcObject
objectClass: organization
o: Lab
dc: lab

dn: ou=people,{S}
objectClass: organizationalUnit
ou: people

dn: ou=guests,{S}
objectClass: organizationalUnit
ou: guests

dn: ou=groups,{S}
objectClass: organizationalUnit
ou: groups

dn: uid=ann,ou=people,{S}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: ann
cn: Ann Lee
givenName: Ann
sn: Lee
mail: ann@lab.example
uidNumber: 20001
gidNumber: 20001
homeDirectory: /home/ann
userPassword: ann-pass

dn: uid=ben,ou=people,{S}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: ben
cn: Ben Wu
sn: Wu
mail: ben@lab.example
uidNumber: 20002
gidNumber: 20002
homeDirectory: /home/ben
userPassword: ben-pass

dn: uid=gus,ou=guests,{S}
objectClass: inetOrgPerson
objectClass: posixAccount
uid: gus
cn: Gus Guest
sn: Guest
uidNumber: 20009
gidNumber: 20009
homeDirectory: /home/gus
userPassword: gus-pass

dn: cn=phd,ou=groups,{S}
objectClass: posixGroup
cn: phd
gidNumber: 30001
memberUid: ann

dn: cn=masters,ou=groups,{S}
objectClass: posixGroup
cn: masters
gidNumber: 30002
memberUid: ben
"""


def require_django_auth_ldap() -> None:
    """Skips where the ldap extra is not installed (make install adds it only where
    python-ldap can be built); fails under CI=true, which installs what it needs."""
    try:
        import django_auth_ldap  # noqa: F401
    except ImportError:
        require_in_ci(
            "django-auth-ldap (python-ldap builds from source: apt-get install gcc "
            "libldap2-dev libsasl2-dev, then make install)"
        )


@pytest.fixture(scope="module")
def slapd() -> Iterator[local_slapd.LocalSlapd]:
    missing = local_slapd.missing()
    if missing:
        require_in_ci(missing)
    require_django_auth_ldap()
    server = local_slapd.LocalSlapd(SEED)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def ldap_settings(settings: Any, monkeypatch: Any, slapd: local_slapd.LocalSlapd) -> Any:
    """The portal configured as an operator would: from the environment, through settings.py's
    own parser (labportal/campus_login.py)."""
    for name, value in {
        "LABPORTAL_LDAP_URI": slapd.uri,
        "LABPORTAL_LDAP_USER_SEARCH_BASE": f"ou=people,{S}",
        "LABPORTAL_LDAP_GROUP_SEARCH_BASE": f"ou=groups,{S}",
        "LABPORTAL_LDAP_GROUP_TYPE": "posix",
        "LABPORTAL_LDAP_GROUP_CATEGORIES": "phd=PhD,masters=Master",
    }.items():
        monkeypatch.setenv(name, value)
    login = ldap_login()
    for name, value in login.settings.items():
        setattr(settings, name, value)
    settings.LABPORTAL_LDAP_ENABLED = True
    settings.LABPORTAL_LDAP_GROUP_CATEGORIES = login.group_categories
    settings.AUTHENTICATION_BACKENDS = [
        *settings.AUTHENTICATION_BACKENDS,
        "accounts.directory.DirectoryBackend",
    ]
    settings.LABPORTAL_LOGIN_FAILURES_PER_ACCOUNT = 3
    Category.objects.create(name="PhD")
    Category.objects.create(name="Master")
    return settings


def sign_in(login: str, password: str) -> Any:
    return Client(REMOTE_ADDR="198.51.100.7").post(
        reverse("account_login"), {"login": login, "password": password}
    )


def test_right_password_creates_the_member_in_the_mapped_category_with_the_uid(
    ldap_settings: Any,
) -> None:
    response = sign_in("ann", "ann-pass")
    assert response.status_code == 302, response.content.decode()[:2000]
    ann = User.objects.get(username="ann")
    assert ann.category is not None and ann.category.name == "PhD"
    assert (ann.unix_uid, ann.unix_gid) == (20001, 20001)
    assert ann.ensure_unix_ids() == (20001, 20001)  # containers run as the directory's uid
    assert ann.email == "ann@lab.example" and ann.first_name == "Ann"
    assert not ann.has_usable_password()  # the directory holds the password
    assert UnixLogin.objects.get(user=ann).username == "ann"  # Slurm mode's login


def test_wrong_password_is_refused_and_counts_for_the_lockout(ldap_settings: Any) -> None:
    assert sign_in("ann", "ann-pass").status_code == 302
    for _ in range(3):
        refused = sign_in("ann", "wrong")
        assert refused.status_code == 200
    # Locked now: the right password is refused too, with the lockout's message.
    locked = sign_in("ann", "ann-pass")
    assert locked.status_code == 200
    assert "locked" in locked.content.decode()


def test_a_person_outside_the_search_base_is_refused(ldap_settings: Any) -> None:
    assert sign_in("gus", "gus-pass").status_code == 200
    assert not User.objects.filter(username="gus").exists()


def test_a_group_change_moves_the_member_on_next_sign_in(
    ldap_settings: Any, slapd: local_slapd.LocalSlapd
) -> None:
    assert sign_in("ben", "ben-pass").status_code == 302
    assert User.objects.get(username="ben").category.name == "Master"  # type: ignore[union-attr]
    slapd.modify(
        f"dn: cn=phd,ou=groups,{S}\nchangetype: modify\nadd: memberUid\nmemberUid: ben\n\n"
        f"dn: cn=masters,ou=groups,{S}\nchangetype: modify\ndelete: memberUid\nmemberUid: ben\n"
    )
    try:
        assert sign_in("ben", "ben-pass").status_code == 302
        assert User.objects.get(username="ben").category.name == "PhD"  # type: ignore[union-attr]
    finally:
        slapd.modify(
            f"dn: cn=masters,ou=groups,{S}\nchangetype: modify\nadd: memberUid\nmemberUid: ben\n\n"
            f"dn: cn=phd,ou=groups,{S}\nchangetype: modify\ndelete: memberUid\nmemberUid: ben\n"
        )


def test_local_accounts_still_sign_in(ldap_settings: Any, alice: Any) -> None:
    from tests.conftest import PASSWORD

    assert sign_in("alice", PASSWORD).status_code == 302


def test_a_half_done_configuration_stops_the_start(monkeypatch: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    require_django_auth_ldap()

    monkeypatch.setenv("LABPORTAL_LDAP_URI", "ldap://127.0.0.1:1")
    monkeypatch.delenv("LABPORTAL_LDAP_USER_SEARCH_BASE", raising=False)
    with pytest.raises(ImproperlyConfigured, match="LABPORTAL_LDAP_USER_SEARCH_BASE"):
        ldap_login()
    monkeypatch.setenv("LABPORTAL_LDAP_URI", "http://ldap.example")
    with pytest.raises(ImproperlyConfigured, match="ldap://"):
        ldap_login()
