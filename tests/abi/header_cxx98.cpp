// The public header must compile as old C++ too (C++98, -pedantic -Werror):
// embedders may be stuck on old toolchains. Only compiled, never run.
#include <llm.h>

int llm_abi_header_cxx98_probe() {
  llm_sampling s;
  llm_sampling_init(&s);
  return static_cast<int>(s.struct_size) + static_cast<int>(LLM_OK);
}
