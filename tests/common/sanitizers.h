// Whether this test binary is built with AddressSanitizer or ThreadSanitizer
// (GCC defines __SANITIZE_*; Clang answers __has_feature). Tests that run a
// smaller workload, or skip what a sanitizer runtime cannot do, read this.
#pragma once

namespace llm::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

}  // namespace llm::testing
