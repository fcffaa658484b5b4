"""vLLM on CPU: first start (to a served /v1/models) and resident memory, eager vs compiled.

Starts the real server once per mode, one after the other, on the embedded SmolLM2 exported to a
transformers directory (``.cache/smollm2-bf16``), then sends one request (timed: the first request
after a start pays the warm-up) and a second identical one. Needs the serving venv
(``make setup-serving``). Takes about 6-8 minutes on 2 cores, most of it torch.compile.

    python benchmarks/serving_start.py [--venv .venv-serving] [--modes eager compiled]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from pathlib import Path

from langgraph_parallelmuse.models.export import export_model
from langgraph_parallelmuse.serving import group_members, serve, vllm_spec

ROOT = Path(__file__).resolve().parents[1]
PROMPT = " ".join(f"Fact {i}: the number {i} comes right before the number {i + 1}." for i in range(55))


def group_rss_mib(pgid: int) -> float:
    """Resident memory of every process of the server's group (API server, engine core, worker)."""
    pages = 0
    for pid in group_members(pgid):
        try:
            pages += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except OSError:
            continue
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed_request(url: str) -> float:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as resp:
        json.load(resp)
    return time.perf_counter() - start


def measure(model_dir: Path, venv: Path, *, eager: bool) -> dict[str, float]:
    spec = vllm_spec(model_dir, venv=venv, enforce_eager=eager, kv_cache_gib=2)
    start = time.perf_counter()
    with serve([spec], startup_timeout=1800, log_dir=ROOT / ".cache" / "serving-start-logs") as (server,):
        ready = time.perf_counter() - start
        first, second = timed_request(server.url), timed_request(server.url)
        return {
            "start_s": ready,
            "first_request_s": first,
            "second_request_s": second,
            "rss_mib": group_rss_mib(server.pid),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-serving")
    ap.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    args = ap.parse_args()
    model_dir = export_model(ROOT / ".cache" / "smollm2-bf16")
    rows = {mode: measure(model_dir, args.venv, eager=mode == "eager") for mode in args.modes}
    print(f"{'mode':10} {'start s':>8} {'1st req s':>10} {'2nd req s':>10} {'RSS MiB':>8}")
    for mode, row in rows.items():
        cells = (row["start_s"], row["first_request_s"], row["second_request_s"], row["rss_mib"])
        print(f"{mode:10} {cells[0]:8.1f} {cells[1]:10.2f} {cells[2]:10.2f} {cells[3]:8.0f}")
    if len(rows) == 2:
        print(f"compiled / eager start: {rows['compiled']['start_s'] / rows['eager']['start_s']:.2f}x")


if __name__ == "__main__":
    main()
