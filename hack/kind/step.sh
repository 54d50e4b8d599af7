#!/usr/bin/env bash
# Runs one build step for lib.sh's `timed` in a fresh shell: `set -e` is ignored inside
# functions called from a condition (`ensure_x || die`), so each step gets a shell where
# any failing command fails the step. Usage: step.sh FUNCTION-OR-COMMAND ARGS...
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=local-images.sh
. "$kind_hack/kind/local-images.sh"
base_image_names
"$@"
