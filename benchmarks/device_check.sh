#!/usr/bin/env bash
# The device check on a GPU node with no network whose Python has torch (and numpy, cloudpickle, typing-extensions,
# packaging, psutil, tqdm, pytest) but not this project's other dependencies: `make wheels` puts those in .whl/ on
# a machine with a network; on the node, from the checkout's root, with .whl/ carried along:
#     bash benchmarks/device_check.sh                 # all parts, cut at DEVICE_CHECK_TIMEOUT seconds (480)
#     bash benchmarks/device_check.sh --parts gb      # the parts a timeout cut off
# PYTHON: the interpreter that has torch (default python3). The report is printed and written to
# $OUT/device_check.txt (OUT unset: /tmp); the exit status is the check's (124: the timeout cut it, with SIGHUP,
# which the trainer leaves to the check; the parts that finished are in the report, and its last line names the rest).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -d .whl ]; then
    site=$(mktemp -d)  # this run's own: nothing shared is overwritten
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
        || exit 1
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
out=${OUT:-/tmp}
mkdir -p "$out" || exit 1
timeout -s HUP -k 15 "${DEVICE_CHECK_TIMEOUT:-480}" "$PYTHON" -u -m benchmarks.device_check "$@" 2>&1 \
    | tee "$out/device_check.txt"
exit "${PIPESTATUS[0]}"
