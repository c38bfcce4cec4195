#!/bin/sh
# ctest driver of the C# binding: run_csharp.sh LIB_DIR MODELS_DIR SOURCE_DIR WORK_DIR
# Builds with Mono's mcs and runs with mono. Exits 77 (ctest skip) when
# either is missing.
set -eu
lib_dir=$1 models_dir=$2 src_dir=$3 work_dir=$4
for tool in mcs mono; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$tool not found: skipping the C# binding tests"
    exit 77
  fi
done
mkdir -p "$work_dir"
mcs -nologo -warnaserror -target:library -out:"$work_dir/LibLlm.dll" "$src_dir/Llm.cs"
mcs -nologo -warnaserror -r:"$work_dir/LibLlm.dll" -r:System.Core -out:"$work_dir/LlmTests.exe" "$src_dir/Tests.cs"
mcs -nologo -warnaserror -r:"$work_dir/LibLlm.dll" -out:"$work_dir/Sample.exe" "$src_dir/Sample.cs"
export LLM_MODELS_DIR="$models_dir"
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" # DllImport("libllm.so.0")
exec mono --debug "$work_dir/LlmTests.exe"
