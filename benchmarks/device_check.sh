#!/usr/bin/env bash
# The device check on a GPU node with no network whose Python has torch (and numpy, psutil, tqdm, pytest) but not
# this project's other dependencies: `make wheels` puts those in .whl/ on a machine with a network; on the node,
# from the checkout's root, with .whl/ carried along:
#     bash benchmarks/device_check.sh                 # all parts, cut at DEVICE_CHECK_TIMEOUT seconds (480)
#     bash benchmarks/device_check.sh --parts gb      # the parts a timeout cut off
# The report is printed and written to $OUT/device_check.txt (OUT unset: /tmp); the exit status is the check's
# (124: the timeout cut it; the parts that finished are in the report).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -d .whl ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
report=${OUT:-/tmp}/device_check.txt
timeout "${DEVICE_CHECK_TIMEOUT:-480}" "$PYTHON" -u -m benchmarks.device_check "$@" 2>&1 | tee "$report"
exit "${PIPESTATUS[0]}"
