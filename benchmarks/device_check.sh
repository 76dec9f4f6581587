#!/usr/bin/env bash
# The device check on a GPU machine (docs/device.md, "Checking a GPU machine"), cut at 8 minutes. On a node with no
# network whose Python has torch (and numpy, cloudpickle, typing-extensions, packaging, psutil, tqdm, pytest) but not
# this project's other dependencies: `make wheels` puts those in .whl/ on a machine with a network; on the node, from
# the checkout's root, with .whl/ carried along:
#     bash benchmarks/device_check.sh                          # every part, within DEVICE_CHECK_TIMEOUT seconds (480)
#     bash benchmarks/device_check.sh --parts whole,precision  # parts the budget cut (the report names them)
# PYTHON: the interpreter that has torch (default python3). The check's budget is the timeout less 20 s (a --budget
# given here wins); the timeout is a hard stop past it (SIGHUP, which the trainer leaves to the check). The text is
# printed and kept in $OUT/device_check.txt, the JSON report in $OUT/device_check.json (OUT unset: /tmp); the exit
# status is the check's (124: the hard stop cut it; the parts that finished are in both reports, and the text's last
# line names the rest).
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
timeout=${DEVICE_CHECK_TIMEOUT:-480}
budget=$(( timeout > 40 ? timeout - 20 : timeout / 2 ))
timeout -s HUP -k 15 "$timeout" "$PYTHON" -u -m benchmarks.device_check --budget "$budget" \
    --json "$out/device_check.json" "$@" 2>&1 | tee "$out/device_check.txt"
exit "${PIPESTATUS[0]}"
