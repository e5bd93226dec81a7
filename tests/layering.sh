#!/bin/sh
# The include graph points down (docs: /DESIGN.md, "Includes point down only"):
# no source of src/LAYER includes a header of a layer above it.
#
# usage: layering.sh SRC_DIR LAYER ABOVE...
#   e.g. layering.sh src io train: fails, naming each file:line, when a file under
#   src/io has #include "train/...".
set -u
src=$1
layer=$2
shift 2
status=0
for above in "$@"; do
  hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]$above/" "$src/$layer" \
         --include='*.cpp' --include='*.hpp' --include='*.h' --include='*.cu' --include='*.cuh')
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s|^\([^:]*:[0-9]*\):.*|\1: src/$layer includes src/$above (src/$layer must know nothing of src/$above)|"
    status=1
  fi
done
[ $status -eq 0 ] && echo "src/$layer includes nothing of: $*"
exit $status
