"""Keep credentials out of everything the library stores or prints.

A server that echoes request headers into an error body (some proxies and debug servers do) would
otherwise put an API key into a trajectory's ``error``, its checkpoints and ``--json`` output.
Every error text that the library keeps goes through :func:`redact`: the secret values it knows
(the model's own ``SecretStr`` fields and the usual key variables of the environment) and anything
shaped like a bearer token, a service's key (``sk-...``, ``tvly-...``, ``hf_...``), an ``api_key=``
pair or a URL's or connection string's password become ``***``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence

from pydantic import BaseModel, SecretStr

__all__ = ["SECRET_ENV_VARS", "fits_a_header", "mask_argv", "redact", "secrets_in_argv", "secrets_of"]

SECRET_ENV_VARS = (
    "OPENAI_API_KEY",
    "TAVILY_API_KEY",
    "ANTHROPIC_API_KEY",
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "VLLM_API_KEY",
)
# The options of the servers the library starts that take a secret (the serving venv's argparse:
# vLLM's --api-key and --hf-token, the routers' --api-key, sglang-router's --oracle-password and
# --control-plane-api-keys, each also with sglang-router's "--router-" prefix), and generic ones.
_SECRET_FLAGS = (
    "--api-key",
    "--hf-token",
    "--token",
    "--password",
    "--oracle-password",
    "--control-plane-api-keys",
    "--router-api-key",
    "--router-oracle-password",
    "--router-control-plane-api-keys",
)
_SHORTEST_SECRET = 6  # shorter values (e.g. "none", "EMPTY") are placeholders, not secrets
_PATTERNS = (
    re.compile(r"(?i)((?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{8,}"),
    # api_key=..., "password": "...", and a printed dict's 'api_key': ['...'].
    re.compile(r"""(?i)((?:api[_-]?key|x-api-key|password|secret|token)["']?\s*[:=]\s*[\["']*)[^\s"',}\]&]{6,}"""),
    # A command line's --api-key VALUE (a server's argv in an error), --hf-token, --oracle-password, ...
    # A bounded prefix after a "--" no word character or dash precedes: unbounded, each "--" of a long
    # dash run read on to the run's end (quadratic: 20,000 dashes took 42 s).
    re.compile(r"(?i)((?<![\w-])--(?:[a-z]+[-_]){0,4}(?:api[-_]keys?|token|password)[\s=]+)\S{6,}"),
    # A URL's query credentials: named so (?access_token=...), or a long value of ?key= (Google's
    # API keys); a short ?key=value or ?sig= of an ordinary link stays.
    re.compile(r"(?i)([?&](?:api_?key|access_token|auth_token|token)=)[^&\s\"']{6,}"),
    # A connection URL's password is one however short (?password=pw1).
    re.compile(r"(?i)([?&]password=)[^&\s\"']+"),
    # So is a libpq key=value string's ("host=db password=pw"), and one quoted there may hold spaces
    # ("password='my pw'"), which the api_key= pattern above stops at.
    re.compile(r"(?i)((?<![\w-])password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s'\"&]+)"),
    re.compile(r"(?i)([?&](?:key|auth|sig|signature)=)[^&\s\"']{24,}"),
    # The password of a URL (postgresql://user:password@host/db, http://user:key@host, an empty user);
    # it never holds a raw "/" (RFC 3986), so host:port/path@... is not one. A scheme is short: read
    # unbounded, each word start of a long run such as "sk-sk-..." or "a.b.c..." read on to the run's
    # end (100,000 characters took 38 s). No word start is asked of it: then a URL glued to a long run
    # of letters ("…e5f6postgresql://app:pw@db") had none within reach, and kept its password.
    re.compile(r"(?i)([a-z][a-z0-9+.-]{0,31}://[^\s/:@]*:)[^\s/@]+(?=@)"),
    # A token given as a URL's user (http://TOKEN@host): user names are short, tokens are not.
    re.compile(r"(?i)([a-z][a-z0-9+.-]{0,31}://)[^\s/:@]{16,}(?=@)"),
    # The keys of the services the library talks to, by their shape, wherever they stand: a key the
    # library was never given (another client's, one in a proxy's config) has no known value to
    # match. The prefix stays, so a reader still sees which service's key it was. A random key mixes
    # cases and digits, a link's slug does not: a search result's /sk-hynix-earnings-report stays.
    re.compile(r"(?<![\w-])(sk-|tvly-)(?=[A-Za-z0-9_-]*[A-Z])(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{16,}"),
    re.compile(r"(?<![\w-])(lsv2_|ls__)[A-Za-z0-9_]{16,}"),  # LangSmith's: lowercase hex
    re.compile(r"(?<![\w-])(hf_)(?=[A-Za-z0-9]*[A-Z])[A-Za-z0-9]{30,}"),  # no "_" in it: hf_hub_download stays
)


def secrets_of(*models: object) -> list[str]:
    """The secret values the library can know: the models' ``SecretStr`` fields and the environment's keys.

    Example:
        >>> from langchain_openai import ChatOpenAI
        >>> "sk-test-123456" in secrets_of(ChatOpenAI(api_key="sk-test-123456", base_url="http://x/v1"))
        True
    """
    found = [os.environ.get(name, "") for name in SECRET_ENV_VARS]
    for model in models:
        for value in _fields(model):
            if isinstance(value, SecretStr):
                found.append(value.get_secret_value())
    # Ties by text: the order of a set of strings changes with each process's hash seed.
    return sorted({s for s in found if len(s) >= _SHORTEST_SECRET}, key=lambda s: (-len(s), s))


def fits_a_header(key: str, *, blanks_inside: bool = False) -> bool:
    """Whether an API key can be sent in an HTTP header as it is: printable ASCII, no spaces.

    httpx refuses any other in every request: a curly quote a chat app or editor put around a key
    failed each call with "UnicodeEncodeError: 'ascii' codec can't encode character", which names
    no key, and a line break with an error that prints the key. ``blanks_inside``: a space or tab
    inside the key is sent as it is (a vLLM ``--api-key`` of two words), only one at its end is not
    (h11 refuses it, and the call failed with "Connection error.").

    Example:
        >>> fits_a_header("tvly-abc123"), fits_a_header("\u201ctvly-abc123\u201d"), fits_a_header("sk-1 2")
        (True, False, False)
        >>> fits_a_header("my local key", blanks_inside=True), fits_a_header("sk-key ", blanks_inside=True)
        (True, False)
    """
    if blanks_inside:
        return key.isascii() and all(c.isprintable() or c == "\t" for c in key) and not key.endswith((" ", "\t"))
    return key.isascii() and key.isprintable() and not any(c.isspace() for c in key)


def secrets_in_argv(argv: Sequence[str], *, flags: Sequence[str] = _SECRET_FLAGS) -> list[str]:
    """The values a command line gives its secret ``flags``, in order.

    A text pattern sees only the first value, but vLLM's ``--api-key`` takes several (argparse's
    ``nargs="+"``: every argument up to the next option), and vLLM logs them all in its arguments.
    An option is read as argparse reads it in vLLM: ``_`` for ``-`` (``--api_key``) and an
    abbreviation (``--api-k``) count.

    Example:
        >>> secrets_in_argv(["vllm", "--api-key", "sk-one", "sk-two", "--port", "80", "--hf_token=hf0"])
        ['sk-one', 'sk-two', 'hf0']
    """
    return [argv[index][start:] for index, start in _secret_values(argv, flags)]


def mask_argv(argv: Sequence[str], *, flags: Sequence[str] = _SECRET_FLAGS) -> list[str]:
    """``argv`` with the values of its secret ``flags`` replaced by ``***``, however short they are.

    Example:
        >>> mask_argv(["vllm", "--api-key", "k1", "k2", "--port", "80", "--hf-token=hf"])
        ['vllm', '--api-key', '***', '***', '--port', '80', '--hf-token=***']
    """
    masked = list(argv)
    for index, start in _secret_values(argv, flags):
        masked[index] = masked[index][:start] + "***"
    return masked


def _secret_values(argv: Sequence[str], flags: Sequence[str]) -> Iterator[tuple[int, int]]:
    """Where the secret values are: ``argv[index][start:]`` for each ``(index, start)``."""
    taking = False
    for index, arg in enumerate(argv):
        if arg.startswith("-"):
            option, given, _ = arg.partition("=")
            secret = _is_secret_flag(option, flags)
            if secret and given:
                yield index, len(option) + 1
            taking = secret and not given
        elif taking:
            yield index, 0


def _is_secret_flag(option: str, flags: Sequence[str]) -> bool:
    # vLLM's FlexibleArgumentParser takes --api_key for --api-key, and argparse takes an unambiguous
    # abbreviation (--api-k); an ambiguous one fails, so counting it costs nothing.
    name = option.replace("_", "-")
    return name in flags or (len(name) > 2 and name.startswith("--") and any(f.startswith(name) for f in flags))


def _fields(model: object) -> Iterable[object]:
    if isinstance(model, BaseModel):
        for name in type(model).model_fields:
            value = getattr(model, name, None)
            yield value
            if isinstance(value, list | tuple):  # e.g. a router's list of models
                for item in value:
                    yield from _fields(item)


def redact(text: str, secrets: Iterable[str] | None = None, *, passwords: Sequence[str] = ()) -> str:
    """``text`` with known secrets and credential-shaped substrings replaced by ``***``.

    Args:
        text: An error message, a log line, a tool output.
        secrets: Secret values to remove (default: :func:`secrets_of` with no model); one shorter than
            6 characters is taken for a placeholder and kept.
        passwords: Values known to be passwords (the one a connection URL holds): removed however
            short; a short one only where it stands as a password (after ":" and before "@", or
            quoted), since as a word it may be the host, port or database the message names.

    Example:
        >>> redact("500: echo Authorization: Bearer sk-live-0123456789abcdef", [])
        '500: echo Authorization: Bearer ***'
        >>> redact("key tvly-abcdefgh leaked", ["tvly-abcdefgh"])
        'key *** leaked'
        >>> redact("db postgresql://alice:S3cret@db.example/runs", [])
        'db postgresql://alice:***@db.example/runs'
        >>> redact("vllm --api-key sk-0123456789 at http://sk0123456789abcdefgh@h/v1?api_key=abcdef123", [])
        'vllm --api-key *** at http://***@h/v1?api_key=***'
        >>> redact('spaces in "my pw"; app:pw@db, pw and pwd kept', [], passwords=["my pw", "pw"])
        'spaces in "***"; app:***@db, pw and pwd kept'
    """
    known = {*(secrets_of() if secrets is None else secrets), *passwords}
    for secret in sorted(known, key=lambda s: (-len(s), s)):  # one holding a shorter one first; ties by text
        if len(secret) >= _SHORTEST_SECRET:
            text = text.replace(secret, "***")
        elif secret and secret in passwords:
            # A password "1" or "runs" replaced as a word took "127.0.0.1" or the database name with it.
            quoted = re.escape(secret)
            text = re.sub(rf"(?<=:){quoted}(?=@)|(?<=\"){quoted}(?=\")|(?<='){quoted}(?=')", "***", text)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    return text
