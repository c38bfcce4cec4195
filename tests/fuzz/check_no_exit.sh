#!/usr/bin/env bash
# check_no_exit.sh LIBLLM_SO [NM] [OBJDUMP]
#
# "No way out of the library": libllm.so must not reference anything that
# ends the process or prints (llm.h: "the library never throws, aborts, exits
# or prints"). Two checks:
#
# 1. Forbidden imports. No undefined dynamic symbol may be one of the
#    process-ending or printing functions below.
# 2. Tolerated imports, by call site. A few symbols cannot be avoided with
#    libstdc++ (std::terminate, which std::thread's destructor and noexcept
#    unwinding reference). Every function of libllm.so that calls one must be
#    on the allowlist; a new call site fails the check until someone has
#    looked at it and listed it (with the reason in docs/RELIABILITY.md).
set -euo pipefail

lib=${1:?usage: check_no_exit.sh LIBLLM_SO [NM] [OBJDUMP]}
nm=${2:-nm}
objdump=${3:-objdump}
fail=0

# ---- 1. forbidden imports (mangled names where C++) ----------------------
forbidden=(
  abort exit _exit _Exit quick_exit at_quick_exit raise kill pthread_kill pthread_exit
  __assert_fail __assert_perror_fail err errx verr verrx warn warnx error error_at_line
  printf vprintf dprintf vdprintf puts putchar putc putc_unlocked fputc fputs fputs_unlocked
  fwrite fwrite_unlocked fprintf vfprintf perror psignal psiginfo syslog vsyslog
  __printf_chk __fprintf_chk __vprintf_chk __vfprintf_chk __dprintf_chk
  stdout stderr
  _ZSt4cout _ZSt4cerr _ZSt4clog _ZSt5wcout _ZSt5wcerr _ZSt5wclog
  system popen execl execlp execle execv execvp execve fork vfork
)
undefined=$("$nm" -D --undefined-only "$lib" | awk '{print $NF}' | sed 's/@.*//')
for sym in "${forbidden[@]}"; do
  if grep -qx -- "$sym" <<<"$undefined"; then
    echo "FORBIDDEN: $lib imports '$sym'"
    fail=1
  fi
done

# ---- 2. tolerated imports: every caller must be allowlisted ----------------
# symbol (mangled) -> allowed calling functions (demangled, extended regex).
declare -A allowed=(
  # std::thread::~thread() calls std::terminate() if the thread is still
  # joinable; ThreadPool joins every thread it started on every path (also
  # when starting one fails) before destroying it. GCC inlines ~thread into
  # these functions, and ~ThreadPool (noexcept) gets a terminate landing pad.
  [_ZSt9terminatev]='^(llm::ThreadPool::ThreadPool\(int\)|llm::ThreadPool::~ThreadPool\(\)|llm::ThreadPool::stop_and_join\(\)|std::thread::~thread\(\)|std::vector<std::thread.*)( \[clone .*\])?$'
)
disasm=$("$objdump" -d --no-show-raw-insn -C "$lib")
for sym in "${!allowed[@]}"; do
  grep -qx -- "$sym" <<<"$undefined" || continue
  demangled=$(echo "$sym" | c++filt)
  # Functions whose body calls (or jumps to) the symbol's PLT stub.
  callers=$(awk -v target="<${demangled}@plt>" '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; sub(/^[0-9a-f]+ </, "", fn); sub(/>:$/, "", fn); next }
    index($0, target) && ($0 ~ /(call|jmp)/) { print fn }
  ' <<<"$disasm" | sort -u)
  while IFS= read -r fn; do
    [ -n "$fn" ] || continue
    if [[ "$fn" =~ ${allowed[$sym]} ]]; then
      echo "tolerated: $demangled called from $fn"
    else
      echo "FORBIDDEN: $demangled called from $fn (not on the allowlist in $0)"
      fail=1
    fi
  done <<<"$callers"
done

# Anything else that ends the process and is not in either list would show up
# here; list the imports for the log.
echo "undefined imports checked: $(wc -l <<<"$undefined")"
if [ "$fail" -ne 0 ]; then
  echo "reliability.no_exit: FAILED"
  exit 1
fi
echo "reliability.no_exit: OK"
