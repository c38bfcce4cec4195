#!/bin/sh
# ctest driver of the Go binding: run_go.sh LIB_DIR MODELS_DIR INCLUDE_DIR SOURCE_DIR WORK_DIR
# Exits 77 (ctest skip) when the go tool is not installed. Everything Go
# writes (build cache, module cache) stays under WORK_DIR; nothing is fetched.
set -eu
lib_dir=$1 models_dir=$2 include_dir=$3 src_dir=$4 work_dir=$5
if ! command -v go >/dev/null 2>&1; then
  echo "go not found: skipping the Go binding tests"
  exit 77
fi
mkdir -p "$work_dir"
export LLM_MODELS_DIR="$models_dir"
# Go's build cache does not see llm.h (outside the package): its checksum in
# CGO_CFLAGS, which is part of the cache key, makes a changed header rebuild.
header_sum=$(cksum < "$include_dir/llm.h" | cut -d' ' -f1)
export CGO_ENABLED=1 CGO_CFLAGS="-I$include_dir -DLLM_HEADER_CKSUM=$header_sum" CGO_LDFLAGS="-L$lib_dir -Wl,-rpath,$lib_dir"
export GOCACHE="$work_dir/cache" GOPATH="$work_dir/gopath" GOMODCACHE="$work_dir/gopath/pkg/mod"
export GOFLAGS=-buildvcs=false GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GO111MODULE=on
cd "$src_dir"
go vet ./...
go build -o "$work_dir/stream-example" ./example
exec go test -count=1 -v .
