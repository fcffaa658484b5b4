"""``load_model`` without real weights: transformers' loaders are replaced by fakes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from langgraph_parallelmuse.models import loading

transformers = pytest.importorskip("transformers")


def test_the_gguf_dequantisation_bar_stays_off_as_transformers_bars_are(tmp_path: Path, monkeypatch, capfd) -> None:
    # transformers' GGUF loader calls tqdm itself, past disable_progress_bar: its bar showed on every load
    # (amid the CLI's own progress display) and left tqdm's monitor thread running for good.
    from transformers import modeling_gguf_pytorch_utils as gguf_loader
    from transformers.utils import logging as hf_logging

    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF")
    own = gguf_loader.tqdm

    def load_weights(*args: object, **kwargs: object) -> SimpleNamespace:
        # What transformers does: the module's tqdm, looked up as the tensors are converted.
        for _ in gguf_loader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        return SimpleNamespace(eval=lambda: None)

    monkeypatch.setattr(loading, "_cache", {})
    monkeypatch.setattr(hf_logging, "_tqdm_active", hf_logging._tqdm_active)  # load_model turns bars off
    monkeypatch.setattr(loading, "_configure_threads", lambda: None)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: object())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load_weights)
    loaded = loading.load_model(str(weights))
    assert loaded.gguf_file == "tiny.gguf"
    assert "de-quantizing" not in capfd.readouterr().err
    assert gguf_loader.tqdm is own  # put back once the weights are loaded
