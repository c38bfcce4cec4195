#!/usr/bin/env bash
# check_layering.sh SRC_DIR
#
# The include rule between src/format, src/quant and src/tools
# (docs/ARCHITECTURE.md, "Layering"):
#   - quant/ never includes format/ (format/ may include quant/: the readers
#     decode weight blocks with it);
#   - only tools/ and the programs in cli/ include tools/ (the offline code
#     that libllm.so does not contain).
# Prints every include that breaks it and exits 1.
set -euo pipefail

src=${1:?usage: check_layering.sh SRC_DIR}
[ -d "$src/quant" ] && [ -d "$src/format" ] && [ -d "$src/tools" ] || {
  echo "check_layering.sh: $src is not libllm's src/ (no quant/, format/ or tools/)" >&2
  exit 2
}
fail=0
include='^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]'

if hits=$(grep -rnE "${include}format/" "$src/quant"); then
  echo "LAYERING: src/quant includes format/ (quant/ must not depend on format/):"
  echo "$hits"
  fail=1
fi

if hits=$(grep -rnE "${include}tools/" "$src" --exclude-dir=tools --exclude-dir=cli); then
  echo "LAYERING: only src/tools and src/cli may include tools/ (offline code, not in libllm.so):"
  echo "$hits"
  fail=1
fi

[ "$fail" = 0 ] && echo "layering: ok"
exit "$fail"
