"""modelserve.secrets: the declared names, their lookup order, and messages that never show a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelserve.secrets import SECRETS_DIR_ENV, SecretNotFound, Secrets, secrets_dir


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("token", "TRUSS_SECRET_token", "other", SECRETS_DIR_ENV):
        monkeypatch.delenv(name, raising=False)


def test_a_secret_is_read_from_the_environment_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    secrets = Secrets({"token": None}, tmp_path)
    assert secrets["token"] == "from-file"
    monkeypatch.setenv("TRUSS_SECRET_token", "truss-style")
    assert secrets["token"] == "truss-style"
    monkeypatch.setenv("token", "plain")
    assert secrets["token"] == "plain"


@pytest.mark.parametrize(
    ("content", "expected"), [("abc", "abc"), ("abc\n", "abc"), ("abc\r\n", "abc"), ("a\n\n", "a\n")]
)
def test_a_secret_file_loses_one_trailing_newline(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "token").write_text(content, newline="")
    assert Secrets({"token": None}, tmp_path)["token"] == expected


def test_the_declared_value_is_the_last_resort(tmp_path: Path) -> None:
    # Truss's SecretsResolver falls back on the value written in config.yaml (test_basic_truss: foo: "foo")
    secrets = Secrets({"token": "written", "other": ""}, tmp_path)
    assert secrets["token"] == "written"
    with pytest.raises(SecretNotFound):
        secrets["other"]


def test_an_unset_secret_says_how_to_provide_it(tmp_path: Path) -> None:
    secrets = Secrets({"token": None}, tmp_path)
    with pytest.raises(KeyError) as caught:
        secrets["token"]
    message = str(caught.value)
    assert message.startswith("secret 'token' is declared but not set; set the environment variable token")
    assert str(tmp_path / "token") in message and "--secrets-dir" in message
    assert "token" not in secrets and secrets.get("token") is None


def test_an_undeclared_secret_is_refused_even_when_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("other", "value-of-other")
    secrets = Secrets({"token": None}, tmp_path)
    with pytest.raises(SecretNotFound) as caught:
        secrets["other"]
    assert "secret 'other' is not declared; add it under 'secrets:'" in str(caught.value)
    assert "value-of-other" not in str(caught.value)


def test_values_never_show(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("token", "s3cr3t")
    secrets = Secrets({"token": None, "other": None}, tmp_path)
    assert "s3cr3t" not in repr(secrets) and "s3cr3t" not in str(secrets)
    assert repr(secrets) == "Secrets(['other', 'token'])"
    assert list(secrets) == ["token", "other"] and len(secrets) == 2


def test_the_secrets_folder_defaults_to_truss_s(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert secrets_dir() == Path("/secrets")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path))
    (tmp_path / "token").write_text("mounted")
    assert secrets_dir() == tmp_path
    assert Secrets({"token": None})["token"] == "mounted"  # read when read, not when made
