#!/usr/bin/env bash
# Install each supported flashinfer-python release into its own folder for the export tests
# (tests/test_flashinfer_export.py): `pip install --no-deps --target`, plus the few small packages
# that importing flashinfer.autotuner and flashinfer.gemm needs. FlashInfer's full dependency set
# (cuda-python, nvidia-cutlass-dsl, nvidia-cudnn-frontend, nccl, cuda-tile ...) is several GB and
# needs none of it to load a cache file, so it is left out.
# Idempotent: a folder whose flashinfer reports the wanted version is kept.
# Folder: $FP4_FLASHINFER_TARGETS (default .flashinfer/ in the repository, git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
root="${FP4_FLASHINFER_TARGETS:-$PWD/.flashinfer}"
versions=(0.7.2.post1 0.7.4)
deps=("apache-tvm-ffi>=0.1.11,<0.2" "nvidia-ml-py" "tqdm")
mkdir -p "$root"
if ! PYTHONPATH="$root/deps" python3 -c "import tvm_ffi, pynvml, tqdm" 2>/dev/null; then
    rm -rf "$root/deps"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$root/deps" "${deps[@]}"
fi
for v in "${versions[@]}"; do
    dest="$root/$v"
    have=$(sed -n 's/^Version: //p' "$dest"/flashinfer_python-*.dist-info/METADATA 2>/dev/null | head -1 || true)
    if [ "$have" = "$v" ]; then continue; fi
    rm -rf "$dest"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$dest" "flashinfer-python==$v"
done
echo "flashinfer targets ready under $root: ${versions[*]} (+ deps)"
