// Giving back memory that is free but still resident.
#pragma once

namespace llm {

// Hands memory that is free but still resident back to the system (glibc's
// heap and mimalloc's caches). Called after a load, whose parsing frees
// tens of megabytes of metadata at once (a GGUF vocabulary array becomes one
// GgufValue per element while the file is read). Changes no live allocation.
void release_free_memory() noexcept;

}  // namespace llm
