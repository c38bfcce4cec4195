#!/usr/bin/env bash
# check_layering.sh SRC_DIR
#
# The include rule between src/format, src/quant and src/convert
# (docs/ARCHITECTURE.md, "Layering"):
#   - quant/ never includes format/ (format/ may include quant/: the readers
#     decode weight blocks with it);
#   - format/ never includes model/ (the family interface the readers call,
#     format/family_spec.h, is in format/; model/ implements it);
#   - only convert/ and the programs in cli/ include convert/ (the offline code
#     that libllm.so does not contain).
# Prints every include that breaks it and exits 1.
set -euo pipefail

src=${1:?usage: check_layering.sh SRC_DIR}
[ -d "$src/quant" ] && [ -d "$src/format" ] && [ -d "$src/convert" ] || {
  echo "check_layering.sh: $src is not libllm's src/ (no quant/, format/ or convert/)" >&2
  exit 2
}
fail=0
include='^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]'

if hits=$(grep -rnE "${include}format/" "$src/quant"); then
  echo "LAYERING: src/quant includes format/ (quant/ must not depend on format/):"
  echo "$hits"
  fail=1
fi

if hits=$(grep -rnE "${include}model/" "$src/format"); then
  echo "LAYERING: src/format includes model/ (model/ reads files through format/, not the other way):"
  echo "$hits"
  fail=1
fi

if hits=$(grep -rnE "${include}convert/" "$src" --exclude-dir=convert --exclude-dir=cli); then
  echo "LAYERING: only src/convert and src/cli may include convert/ (offline code, not in libllm.so):"
  echo "$hits"
  fail=1
fi

[ "$fail" = 0 ] && echo "layering: ok"
exit "$fail"
