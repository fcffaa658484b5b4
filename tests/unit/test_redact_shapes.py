"""Credential shapes :func:`redact` removes without knowing their values, in time linear in the text."""

import pytest

from langgraph_parallelmuse.redact import redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("401: Incorrect API key sk-proj-abcDEF0123456789xyz_12.", "401: Incorrect API key sk-***."),
        ("invalid x-api-key sk-ant-api03-AbCdEf0123456789-xyz", "invalid x-api-key sk-***"),
        ("Unauthorized: missing or invalid API key tvly-dev-AbCdEf0123456789", "invalid API key tvly-***"),
        ("token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567 rejected", "token hf_*** rejected"),
        ("langsmith lsv2_pt_0123456789abcdef0123456789abcdef_0123456789", "langsmith lsv2_***"),
    ],
)
def test_a_provider_key_is_redacted_by_its_shape(text, expected):
    # Before: a key the library was not given (none in the environment, none of the model's) stayed.
    assert redact(text, []).endswith(expected)


@pytest.mark.parametrize(
    "text",
    [
        "the task-list holds sk-learn",
        "call hf_hub_download_to_local_dir(...)",
        "ask-0123456789abcdefghij",
        "[2] https://news.example/sk-hynix-memory-earnings-2026 (id: u2)",
    ],
)
def test_words_that_only_look_like_a_key_prefix_stay(text):
    assert redact(text, []) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("host=db user=app password=pw dbname=runs", "host=db user=app password=*** dbname=runs"),
        ("host=db password='my secret pw' dbname=runs", "host=db password=*** dbname=runs"),
        (r"password='it\'s me' port=5432", "password=*** port=5432"),
    ],
)
def test_a_libpq_password_is_redacted_however_short_or_quoted(text, expected):
    # Before: the api_key= pattern took only 6 or more characters up to a space: "pw" and "my secret pw" stayed.
    assert redact(text, []) == expected


@pytest.mark.timeout(30)  # a guard: each input below is redacted in milliseconds
@pytest.mark.parametrize("run", ["sk-", "a.", "x1+", "--a-"])
def test_a_long_run_of_scheme_characters_is_redacted_in_linear_time(run):
    # A URL scheme read unbounded from each word start of such a run read on to its end: 120,000
    # characters of "sk-" took 38 s.
    text = run * (120_000 // len(run)) + " postgresql://app:pw@db/runs"
    assert redact(text, []).endswith("postgresql://app:***@db/runs")


def test_a_url_glued_to_a_long_run_of_letters_keeps_no_password():
    # A scheme bounded to 32 characters and asked to start a word found no start within reach.
    text = "a1b2c3d4e5f6" * 4 + "postgresql://app:hunter2@db/x"
    assert "hunter2" not in redact(text, [])
