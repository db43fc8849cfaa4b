"""etcd with TLS and authentication: settings from the environment, and every
refused credential as a PermissionDenied naming what was refused (the shared
contract suite runs on the secure server too, see conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from headrace import errors
from headrace.metastore import Put
from headrace.metastore import etcd as etcd_module
from headrace.metastore.etcd import EtcdMetastore
from headrace.metastore.etcd_security import (
    ENV_CACERT,
    ENV_CERT,
    ENV_KEY,
    ENV_PASSWORD_FILE,
    ENV_USER,
    EtcdCredentials,
    EtcdSecurity,
    certificate_validity,
    check_validity,
    load,
    read_password,
)
from headrace.metastore.factory import open_metastore, parse_url
from headrace_testbed.etcd import EtcdServer
from headrace_testbed.etcd_auth import (
    READER,
    TOKEN_TTL_S,
    WRITER,
    add_user,
    change_password,
)
from headrace_testbed.pki import ETCD_EXPIRED_CLIENT, ETCD_NOBODY, ETCD_STRANGER, write_etcd_pki
from headrace_testbed.ports import free_port
from tests.fixtures_etcd import secure_settings

NOW = datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC)

# -- settings (no server) ---------------------------------------------------------


def test_etcds_url_means_tls() -> None:
    assert parse_url("etcds://10.0.0.1:2379").tls
    assert not parse_url("etcd://10.0.0.1:2379").tls


def test_settings_come_from_the_environment() -> None:
    env = {
        ENV_CACERT: "/s/ca.crt",
        ENV_CERT: "/s/tls.crt",
        ENV_KEY: "/s/tls.key",
        ENV_USER: "headrace",
        ENV_PASSWORD_FILE: "/s/password",
    }
    assert EtcdSecurity.from_env(env, tls=True) == EtcdSecurity(
        True, "/s/ca.crt", "/s/tls.crt", "/s/tls.key", "headrace", "/s/password"
    )
    assert EtcdSecurity.from_env({}, tls=False) == EtcdSecurity()


@pytest.mark.parametrize(
    ("env", "tls", "named"),
    [
        ({ENV_CACERT: "/ca.crt"}, False, "use etcds://"),
        ({ENV_CERT: "/tls.crt", ENV_KEY: "/tls.key"}, False, "use etcds://"),
        ({ENV_CERT: "/tls.crt"}, True, ENV_KEY),
        ({ENV_KEY: "/tls.key"}, True, ENV_CERT),
        ({ENV_USER: "headrace"}, True, ENV_PASSWORD_FILE),
        ({ENV_PASSWORD_FILE: "/password"}, False, ENV_USER),
    ],
)
def test_settings_that_do_not_fit_together_are_invalid(
    env: dict[str, str], tls: bool, named: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=named):
        EtcdSecurity.from_env(env, tls=tls)


async def test_plaintext_url_with_certificates_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_CACERT, "/nowhere/ca.crt")
    with pytest.raises(errors.InvalidArgument, match=f"{ENV_CACERT} set for a plaintext"):
        await open_metastore("etcd://127.0.0.1:1", connect_timeout=0.5)


def test_unreadable_or_foreign_files_are_named(tmp_path: Path) -> None:
    missing = EtcdSecurity(tls=True, ca_file=str(tmp_path / "missing.crt"))
    with pytest.raises(errors.InvalidArgument, match=f"{ENV_CACERT}=.*missing.crt"):
        load(missing, NOW)
    (tmp_path / "text.crt").write_text("not a certificate\n")
    foreign = EtcdSecurity(tls=True, ca_file=str(tmp_path / "text.crt"))
    with pytest.raises(errors.InvalidArgument, match="is not a PEM file"):
        load(foreign, NOW)
    (tmp_path / "empty").write_text("")
    no_password = EtcdSecurity(user="u", password_file=str(tmp_path / "empty"))
    with pytest.raises(errors.InvalidArgument, match=f"{ENV_PASSWORD_FILE}=.*is empty"):
        read_password(no_password)


def test_password_file_keeps_everything_but_the_line_end(tmp_path: Path) -> None:
    (tmp_path / "password").write_text(" s3cret with spaces \n")
    security = EtcdSecurity(user="u", password_file=str(tmp_path / "password"))
    assert read_password(security) == " s3cret with spaces "


def test_certificate_validity_matches_cryptography(tmp_path: Path) -> None:
    pki = write_etcd_pki(tmp_path)
    for stem in ("client", ETCD_EXPIRED_CLIENT, "server", "ca"):
        pem = pki.cert(stem).read_bytes()
        parsed = x509.load_pem_x509_certificate(pem)
        assert certificate_validity(pem, stem) == (
            parsed.not_valid_before_utc,
            parsed.not_valid_after_utc,
        )


def test_expired_or_future_client_certificate_is_refused_before_dialing(tmp_path: Path) -> None:
    pki = write_etcd_pki(tmp_path)
    now = datetime.datetime.now(datetime.UTC)
    with pytest.raises(errors.PermissionDenied, match=r"old\.crt expired at"):
        check_validity(pki.cert(ETCD_EXPIRED_CLIENT).read_bytes(), now, "old.crt")
    check_validity(pki.cert("client").read_bytes(), now, "client")
    with pytest.raises(errors.PermissionDenied, match="valid only from"):
        check_validity(pki.cert("client").read_bytes(), now - datetime.timedelta(days=1), "c")


def test_garbled_certificate_is_invalid_argument() -> None:
    garbled = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    with pytest.raises(errors.InvalidArgument, match="cannot be decoded"):
        certificate_validity(garbled, "garbled.crt")


# -- the real etcd with TLS and authentication on -----------------------------------


def _settings(server: EtcdServer, **changes: str) -> EtcdSecurity:
    return dataclasses.replace(secure_settings(server), **changes)


async def _refused(server: EtcdServer, security: EtcdSecurity) -> errors.PermissionDenied:
    with pytest.raises(errors.PermissionDenied) as caught:
        store = await open_metastore(server.url, etcd_security=security, connect_timeout=5.0)
        await store.close()
    return caught.value


@pytest.mark.etcd
async def test_settings_from_the_environment_reach_a_secure_etcd(
    etcd_secure_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = secure_settings(etcd_secure_server)
    monkeypatch.setenv(ENV_CACERT, settings.ca_file)
    monkeypatch.setenv(ENV_CERT, settings.cert_file)
    monkeypatch.setenv(ENV_KEY, settings.key_file)
    monkeypatch.setenv(ENV_USER, settings.user)
    monkeypatch.setenv(ENV_PASSWORD_FILE, settings.password_file)
    async with await open_metastore(etcd_secure_server.url) as store:
        assert store.url == etcd_secure_server.url
        await store.put("/security/env", b"ok")
        got = await store.get("/security/env")
        assert got is not None and got.value == b"ok"


@pytest.mark.etcd
async def test_client_certificate_alone_authenticates_as_its_common_name(
    etcd_secure_server: EtcdServer,
) -> None:
    cert_only = _settings(etcd_secure_server, user="", password_file="")
    async with await open_metastore(etcd_secure_server.url, etcd_security=cert_only) as store:
        await store.put("/security/cert-only", b"ok")


@pytest.mark.etcd
async def test_certificate_of_no_user_without_a_password_is_permission_denied(
    etcd_secure_server: EtcdServer,
) -> None:
    auth = etcd_secure_server.auth
    assert auth is not None
    nobody = _settings(
        etcd_secure_server,
        user="",
        password_file="",
        cert_file=str(auth.pki.cert(ETCD_NOBODY)),
        key_file=str(auth.pki.key(ETCD_NOBODY)),
    )
    refused = await _refused(etcd_secure_server, nobody)
    assert "the client certificate's common name: no such etcd user" in refused.message
    assert ENV_USER in refused.message and str(auth.pki.cert(ETCD_NOBODY)) in refused.message


@pytest.mark.etcd
async def test_wrong_password_is_permission_denied_naming_the_user(
    etcd_secure_server: EtcdServer, tmp_path: Path
) -> None:
    (tmp_path / "password").write_text("not-the-password\n")
    wrong = _settings(etcd_secure_server, password_file=str(tmp_path / "password"))
    refused = await _refused(etcd_secure_server, wrong)
    assert f"user {WRITER!r}" in refused.message
    assert "wrong user name or password" in refused.message
    assert "not-the-password" not in refused.message


@pytest.mark.etcd
async def test_unknown_user_is_permission_denied(etcd_secure_server: EtcdServer) -> None:
    stranger = _settings(etcd_secure_server, user="nobody")
    refused = await _refused(etcd_secure_server, stranger)
    assert "user 'nobody'" in refused.message and "wrong user name or password" in refused.message


@pytest.mark.etcd
async def test_wrong_ca_is_permission_denied_naming_the_ca(etcd_secure_server: EtcdServer) -> None:
    auth = etcd_secure_server.auth
    assert auth is not None
    other_ca = str(auth.pki.other_ca_cert)
    refused = await _refused(etcd_secure_server, _settings(etcd_secure_server, ca_file=other_ca))
    assert "server certificate is not trusted" in refused.message
    assert f"{ENV_CACERT}={other_ca}" in refused.message


@pytest.mark.etcd
async def test_missing_client_certificate_is_permission_denied(
    etcd_secure_server: EtcdServer,
) -> None:
    no_cert = _settings(etcd_secure_server, cert_file="", key_file="")
    refused = await _refused(etcd_secure_server, no_cert)
    assert "rejects a client certificate" in refused.message
    assert "presented no client certificate" in refused.message


@pytest.mark.etcd
async def test_client_certificate_of_an_untrusted_ca_is_permission_denied(
    etcd_secure_server: EtcdServer,
) -> None:
    auth = etcd_secure_server.auth
    assert auth is not None
    stranger = _settings(
        etcd_secure_server,
        cert_file=str(auth.pki.cert(ETCD_STRANGER)),
        key_file=str(auth.pki.key(ETCD_STRANGER)),
    )
    refused = await _refused(etcd_secure_server, stranger)
    assert f"the client certificate {auth.pki.cert(ETCD_STRANGER)}" in refused.message


@pytest.mark.etcd
async def test_expired_client_certificate_is_permission_denied(
    etcd_secure_server: EtcdServer,
) -> None:
    auth = etcd_secure_server.auth
    assert auth is not None
    expired = _settings(
        etcd_secure_server,
        cert_file=str(auth.pki.cert(ETCD_EXPIRED_CLIENT)),
        key_file=str(auth.pki.key(ETCD_EXPIRED_CLIENT)),
    )
    refused = await _refused(etcd_secure_server, expired)
    assert f"{ENV_CERT}={auth.pki.cert(ETCD_EXPIRED_CLIENT)} expired at" in refused.message


@pytest.mark.etcd
async def test_expired_client_certificate_is_refused_by_etcd_too(
    etcd_secure_server: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a client clock ten days behind (so its own check passes), etcd's
    refusal of the expired certificate is named."""
    auth = etcd_secure_server.auth
    assert auth is not None
    expired = _settings(
        etcd_secure_server,
        cert_file=str(auth.pki.cert(ETCD_EXPIRED_CLIENT)),
        key_file=str(auth.pki.key(ETCD_EXPIRED_CLIENT)),
    )

    def load_with_slow_clock(security: EtcdSecurity, now: datetime.datetime) -> EtcdCredentials:
        return load(security, now - datetime.timedelta(days=10))

    monkeypatch.setattr(etcd_module, "load", load_with_slow_clock)
    refused = await _refused(etcd_secure_server, expired)
    assert "rejects a client certificate" in refused.message
    assert "not expired" in refused.message


@pytest.mark.etcd
async def test_etcds_to_a_plaintext_etcd_is_unavailable_naming_tls(etcd_url: str) -> None:
    plain = etcd_url.replace("etcd://", "etcds://")
    with pytest.raises(errors.Unavailable, match="during the TLS handshake"):
        await open_metastore(plain, etcd_security=EtcdSecurity(tls=True), connect_timeout=5.0)


@pytest.mark.etcd
async def test_a_role_without_write_permission_is_permission_denied(
    etcd_secure_server: EtcdServer,
) -> None:
    auth = etcd_secure_server.auth
    assert auth is not None
    reader = _settings(
        etcd_secure_server, user=READER, password_file=str(auth.password_file(READER))
    )
    async with await open_metastore(etcd_secure_server.url, etcd_security=reader) as store:
        assert await store.get("/security/anything") is None
        denied = f"user {READER!r}.*permission denied.*roles of user {READER!r} lack"
        with pytest.raises(errors.PermissionDenied, match=denied):
            await store.put("/security/by-reader", b"x")
        with pytest.raises(errors.PermissionDenied, match="permission denied"):
            await store.txn([], [Put("/security/by-reader", b"x")])
        watch = await store.watch_prefix("/security/")
        await watch.close()


@pytest.mark.etcd
async def test_an_expired_token_is_renewed_and_the_call_repeated(
    etcd_secure_server: EtcdServer, etcd_secure_settings: EtcdSecurity
) -> None:
    store = await EtcdMetastore.connect(
        [("127.0.0.1", etcd_secure_server.client_port)], security=etcd_secure_settings
    )
    try:
        first = store._token
        watch = await store.watch_prefix("/security/token/")
        await asyncio.sleep(TOKEN_TTL_S + 2)
        await store.put("/security/token/k", b"after idle")
        assert store._token and store._token != first
        event = await anext(aiter(watch))
        assert event.kv.value == b"after idle"
        lease = await store.grant_lease(5)
        await store.keep_alive(lease)
        await watch.close()
    finally:
        await store.close()


def _cli_status(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "headrace.cli", "status", "--metastore", url, "--cluster", "c"]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.etcd
def test_a_headrace_process_takes_its_etcd_credentials_from_the_environment(
    etcd_secure_server: EtcdServer,
) -> None:
    """`headrace status` reaches the secure etcd with the variables alone (it
    finds no cluster there: NOT_FOUND, after authenticating); with the reader's
    password file it is refused by name."""
    settings = secure_settings(etcd_secure_server)
    env = dict(
        os.environ,
        **{
            ENV_CACERT: settings.ca_file,
            ENV_CERT: settings.cert_file,
            ENV_KEY: settings.key_file,
            ENV_USER: settings.user,
            ENV_PASSWORD_FILE: settings.password_file,
        },
    )
    found = _cli_status(etcd_secure_server.url, env)
    assert "NOT_FOUND" in found.stderr and "has no cluster 'c'" in found.stderr, found.stderr
    auth = etcd_secure_server.auth
    assert auth is not None
    env[ENV_PASSWORD_FILE] = str(auth.password_file(READER))
    refused = _cli_status(etcd_secure_server.url, env)
    assert refused.returncode != 0
    assert "PERMISSION_DENIED" in refused.stderr and "wrong user name or password" in refused.stderr
    assert auth.password(READER) not in refused.stderr + refused.stdout


@pytest.mark.etcd
async def test_several_tls_endpoints_fail_over_to_the_one_that_answers(
    etcd_secure_server: EtcdServer, etcd_secure_settings: EtcdSecurity
) -> None:
    """Several endpoints share one channel of resolved addresses; over TLS the
    first one, down, is skipped (given as an address and as a name)."""
    for first in ("127.0.0.1", "localhost"):
        url = f"etcds://{first}:{free_port()},localhost:{etcd_secure_server.client_port}"
        async with await open_metastore(url, etcd_security=etcd_secure_settings) as store:
            await store.put("/security/failover", first.encode())


@pytest.mark.etcd
async def test_a_rotated_password_file_is_read_at_the_next_authentication(
    etcd_secure_server: EtcdServer, tmp_path: Path
) -> None:
    """The password changes in etcd and in the file (a rotated Secret) while a
    store is open: once the old token expires, the store authenticates with
    the new password and the call goes through."""
    auth = etcd_secure_server.auth
    assert auth is not None
    user = f"rotating-{tmp_path.name[-8:]}"
    password_file = tmp_path / "password"
    password_file.write_text("first-password\n")
    endpoint = etcd_secure_server.endpoint
    await asyncio.to_thread(add_user, auth, endpoint, user, "first-password", WRITER)
    rotating = _settings(etcd_secure_server, user=user, password_file=str(password_file))
    async with await open_metastore(etcd_secure_server.url, etcd_security=rotating) as store:
        await store.put("/security/rotation", b"before")
        await asyncio.to_thread(change_password, auth, endpoint, user, "second-password")
        password_file.write_text("second-password\n")
        await asyncio.sleep(TOKEN_TTL_S + 2)
        await store.put("/security/rotation", b"after")
        got = await store.get("/security/rotation")
        assert got is not None and got.value == b"after"


@pytest.mark.etcd
async def test_a_user_for_an_etcd_without_auth_is_not_needed(etcd_url: str, tmp_path: Path) -> None:
    """Like etcd's own client: authentication not enabled on the server means
    calls without a token, not an error."""
    (tmp_path / "password").write_text("unused\n")
    security = EtcdSecurity(user="someone", password_file=str(tmp_path / "password"))
    async with await open_metastore(etcd_url, etcd_security=security) as store:
        await store.put("/security/no-auth", b"ok")
        assert isinstance(store, EtcdMetastore) and store._metadata() == ()
