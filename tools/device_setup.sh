# Source this on the GPU machine (no network there): installs optuna and its needs
# from the wheels carried in .whl/, then the project in editable mode. The GPU tests of
# PyTorch's OpInfo samples also need expecttest (a test extra): carry its wheel in .whl/ too
# (`pip download --no-deps -d .whl expecttest` on a machine with network).
case "${1:-}" in -h|--help) sed -n '1,/^[^#]/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; return 0 2>/dev/null || exit 0;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site \
  && python3 -m pip install -q --no-deps --no-build-isolation -e . || return 1
export TUNER_HOME=${TUNER_HOME:-/tmp/tuner-home} TUNER_TEST_HOME=${TUNER_TEST_HOME:-/tmp/tuner-home}
export PYTHONUNBUFFERED=1
