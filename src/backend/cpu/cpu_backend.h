// The CPU backend: the Backend interface (backend/backend.h) over the
// model's host page pools and the CPU forward pass (forward.h).
//
// A sequence holds one page table per KV group: 0 = the global layers (all
// layers when the model has no split), 1 = the sliding-window layers
// (Model::kv_pool_local()), whose entries before local_first()'s page are
// null. Pages are private where written (copy-on-write after a fork).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace llm {
class Model;
}

namespace llm::cpu {

std::unique_ptr<Backend> make_backend(const Model& m);

}  // namespace llm::cpu
