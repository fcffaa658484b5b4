"""The LangGraph server configs: what `langgraph dev` loads from this repository."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from langgraph_parallelmuse.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("langgraph*.json"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_the_env_file_a_server_config_loads_is_never_a_committed_file(config):
    # `langgraph dev` writes the env file's values over the shell's variables: a committed file of
    # placeholders (TAVILY_API_KEY=, OPENAI_API_KEY=not-needed) would replace a user's real keys.
    env = json.loads(config.read_text()).get("env")
    if not isinstance(env, str):
        return
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", env], cwd=ROOT, capture_output=True)
    assert tracked.returncode != 0, f"{config.name} loads {env}, a file in the repository"
    ignored = subprocess.run(["git", "check-ignore", "-q", env], cwd=ROOT)
    assert ignored.returncode == 0, f"{env} (a user's keys) must be git-ignored"


def test_there_are_server_configs():
    assert [p.name for p in CONFIGS] == ["langgraph.json", "langgraph.postgres.json"]


def test_the_served_graphs_variables_set_empty_in_an_env_file_take_their_defaults(monkeypatch):
    # A .env file's placeholder lines ("OPENAI_API_KEY=", "PARALLELMUSE_BASE_URL=") were taken as they
    # were: the empty key failed every run ("Missing credentials"), the empty base URL sent the
    # questions to api.openai.com instead of the local server, the empty model name asked for no model.
    import runpy

    for name in ("OPENAI_API_KEY", "PARALLELMUSE_BASE_URL", "PARALLELMUSE_MODEL", "PARALLELMUSE_AGGREGATOR_MODEL"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-test-key")
    module = runpy.run_path(str(ROOT / "graphs" / "openai_tavily.py"))
    module["graph"]()  # built: the empty key no longer raises
    chat = module["_chat"]("served-model")
    assert chat.openai_api_base == "http://127.0.0.1:8000/v1"
    assert chat.openai_api_key.get_secret_value() == "not-needed"
    assert module["_env"]("PARALLELMUSE_MODEL", "default") == "default"


@pytest.mark.parametrize("base_url", ["127.0.0.1:8000/v1", "localhost:8000", "http://"])
def test_the_served_graph_names_a_base_url_without_scheme_at_once(monkeypatch, base_url):
    # Before, the graph was built, and each run failed after its retries with "Connection error.".
    import runpy

    monkeypatch.setenv("PARALLELMUSE_BASE_URL", base_url)
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-test-key")
    module = runpy.run_path(str(ROOT / "graphs" / "openai_tavily.py"))  # the import `langgraph dev` does still works
    with pytest.raises(ConfigError, match=f"PARALLELMUSE_BASE_URL={base_url!r} must be an http:// or https:// URL"):
        module["graph"]()


def test_the_served_graph_names_an_openai_key_that_cannot_be_sent_at_once(monkeypatch):
    # Before, each run failed with "UnicodeEncodeError: 'ascii' codec can't encode character '\u201c'" and
    # the advice to check that the server is up, the base URL and the model name.
    import runpy

    key = "sk-AbC0123456789abcdefXYZ"
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-test-key")
    module = runpy.run_path(str(ROOT / "graphs" / "openai_tavily.py"))
    # With the line break of a key read from a file too, the error named api_key=, which Studio has none of.
    for pasted in (f"\u201c{key}\u201d", f"\u201c{key}\u201d\n"):
        monkeypatch.setenv("OPENAI_API_KEY", pasted)
        module["_build"].cache_clear()
        with pytest.raises(ConfigError, match=r"\(OPENAI_API_KEY\) holds .* other than ASCII") as info:
            module["graph"]()
        assert key not in str(info.value)
    monkeypatch.setenv("OPENAI_API_KEY", f" {key}\n")  # a line break read with it from a file is dropped
    assert module["_chat"]("served-model").openai_api_key.get_secret_value() == key


def test_the_embedded_graph_module_imports_without_the_rest_of_the_local_extra(monkeypatch):
    # torch installed (a CPU build installed first, as the README says), transformers not: its late
    # import raised out of the graph module, and `langgraph dev` started none of the graphs.
    import runpy

    pytest.importorskip("torch")  # without it the graph says so with a ConfigError, before transformers
    from langgraph_parallelmuse.models import loading

    def load_model(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    monkeypatch.setattr(loading, "load_model", load_model)
    module = runpy.run_path(str(ROOT / "graphs" / "embedded.py"))
    with pytest.raises(ConfigError, match="needs transformers, which is not installed: pip install"):
        module["graph"]()
