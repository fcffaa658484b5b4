"""``--db`` targets refused up front: nothing here starts or needs a database server.

``check_db`` only parses; ``open_checkpointer`` is tried once against a closed loopback port to see
that a refused connection becomes a ConfigError naming the (redacted) URL.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from langgraph_parallelmuse.errors import ConfigError
from langgraph_parallelmuse.persistence import check_db, open_checkpointer
from langgraph_parallelmuse.serving import free_port

pytest.importorskip("langgraph.checkpoint.postgres.aio")


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("postgresql://u@127.0.0.1:99999/db", "99999"),
        ("postgresql://u@:abc/db", "abc"),
        ("postgresql://u@127.0.0.1:0/db", "0"),
        ("postgresql://u@h1:5432,h2:70000/db", "70000"),
    ],
)
def test_a_port_outside_1_to_65535_is_named(url: str, port: str) -> None:
    with pytest.raises(ConfigError, match=rf"--db '{url}': port '{port}' is not a TCP port: .*1 to 65535"):
        check_db(url)


@pytest.mark.parametrize("url", ["postgresql://", "postgres://", "postgresql://alice@/"])
def test_a_url_leaving_host_and_database_to_libpqs_defaults_is_accepted(url: str) -> None:
    # libpq takes them from PGHOST / PGDATABASE or the local socket.
    assert check_db(url) == "postgres"


@pytest.mark.parametrize("url", ["POSTGRESQL://u@127.0.0.1:5432/db", "Postgres://u@127.0.0.1/db"])
def test_the_scheme_is_matched_in_any_case_and_in_both_libpq_spellings(url: str) -> None:
    assert check_db(url) == "postgres"


def test_the_sqlalchemy_form_says_to_drop_the_driver_and_hides_the_password() -> None:
    with pytest.raises(ConfigError, match=r"postgresql\+psycopg:// is SQLAlchemy's form: drop '\+psycopg'") as err:
        check_db("postgresql+psycopg://u:hunter22@127.0.0.1/db")
    assert "--db 'postgresql+psycopg://u:***@127.0.0.1/db'" in str(err.value)
    assert "hunter22" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///tmp/runs.sqlite", "give the SQLite file's path itself, without sqlite://"),
        ("mysql://u@127.0.0.1/db", "mysql:// is not a store this takes"),
    ],
)
def test_another_scheme_is_not_taken_for_a_folder(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"--db '{url}': {message}"):
        check_db(url)


def test_a_url_libpq_cannot_parse_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"is not a valid PostgreSQL URL \(invalid URI query parameter: \"bogus\"\)"):
        check_db("postgresql://u@127.0.0.1/db?bogus=1")


def test_a_sqlite_path_without_the_sqlite_saver_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.sqlite.aio", None)  # import raises ImportError
    with pytest.raises(
        ConfigError, match=r"needs the SQLite checkpointer: pip install 'langgraph-parallelmuse\[persist\]'"
    ):
        check_db(str(tmp_path / "runs.sqlite"))


async def test_a_refused_connection_is_a_config_error_naming_the_redacted_url() -> None:
    url = f"postgresql://u:s3cretpw@127.0.0.1:{free_port()}/db?connect_timeout=5"  # nothing listens there
    with pytest.raises(ConfigError, match=r"cannot open the PostgreSQL database \(.*refused") as err:
        async with open_checkpointer(url):
            pass
    assert f"--db '{url.replace('s3cretpw', '***')}'" in str(err.value)
    assert "s3cretpw" not in str(err.value)


@pytest.mark.parametrize(
    "target", ["host=db.internal user=app password=s3cret dbname=runs", "dbname=runs", "  port = 5433 host=db"]
)
def test_a_libpq_key_value_string_is_refused_not_taken_for_a_sqlite_file(target: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # before the fix a file of that name appeared here
    with pytest.raises(ConfigError, match="libpq key=value string: give the database as a URL") as info:
        check_db(target)
    assert "s3cret" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["./user=alice.db", "runs/port=1.sqlite"])
def test_a_sqlite_path_with_a_folder_is_a_file_even_with_an_equals_sign(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert check_db(name) == "sqlite"


@pytest.mark.parametrize(
    "target",
    [
        "postgresql://app:p@ss-hunter2@db.example:5432/runs",  # libpq took "ss-hunter2@db.example" for the host
        "postgresql://app:pa/hunter2@db.example:5432/runs",  # and "hunter2" for the port
        "host=/var/run/postgresql dbname=runs user=app password=hunter2",  # a socket folder: read as a file path
        "postgresql://db.example:99999/runs?user=app&password=hunt2",  # a short password is one too
        "postgresql://app:Se?c@hunt99@db.example:5432/runs",  # libpq does not end the user info at "?"
        "host=/tmp dbname=runs password=hunt",  # a libpq string, its password short
        "postgresql://app:Sec hunt99@db.example:5432/runs",  # libpq's reason quoted it, space and all
    ],
)
def test_a_db_error_never_shows_the_password(target: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_db(target)
    assert "hunt" not in str(err.value)


@pytest.mark.parametrize("url", ["postgresql://app@db.example:5432/team@runs", "postgresql://u:pw@[::1]:5432/db"])
def test_an_at_sign_in_the_database_name_or_an_ipv6_host_is_accepted(url: str) -> None:
    assert check_db(url) == "postgres"
