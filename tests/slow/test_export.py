"""The exported transformers directory is the embedded GGUF model, weights and chat template alike.

Runs the real model on CPU (about a minute); select with ``pytest -m slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from langgraph_parallelmuse.models.export import EXPORT_MARKER, export_model
from langgraph_parallelmuse.models.loading import load_model

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Which river flows through Vienna? Answer, then explain in two sentences."},
]


@pytest.fixture(scope="module")
def gguf():
    return load_model()  # the embedded GGUF, de-quantised to float32 (what the library runs)


def test_float32_export_continues_exactly_like_the_gguf_model(tmp_path: Path, gguf) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = export_model(tmp_path / "smollm2", dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    assert "quantization_config" not in (path / "config.json").read_text()

    # The server renders prompts with the saved chat template: it must be the GGUF's.
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ref = gguf.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert torch.equal(ids["input_ids"], ref["input_ids"])

    # Same float32 weights, same kernels: greedy decoding must agree token for token (no tolerance).
    for name, tensor in gguf.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=40, do_sample=False)
        want = gguf.model.generate(**ref, max_new_tokens=40, do_sample=False)
    assert out[0].tolist() == want[0].tolist()
    assert tokenizer.decode(out[0, ids["input_ids"].shape[1] :]).strip()


def test_bfloat16_export_is_the_rounded_gguf_and_is_reused(tmp_path: Path, gguf) -> None:
    import torch
    from safetensors.torch import load_file

    path = export_model(tmp_path / "smollm2")  # the default a server runs
    weights = load_file(path / "model.safetensors")
    reference = gguf.model.state_dict()
    assert weights and all(t.dtype == torch.bfloat16 for t in weights.values())
    for name, tensor in weights.items():
        assert torch.equal(tensor, reference[name].to(torch.bfloat16)), name

    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert export_model(path) == path  # a finished export is returned as is
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert export_model(path, dtype="float32") == path  # another dtype replaces it
    assert '"float32"' in (path / EXPORT_MARKER).read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging dir left
