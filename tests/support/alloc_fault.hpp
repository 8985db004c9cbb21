// Fault injection for std::bad_alloc: replaces the global operator new and delete (every form,
// the nothrow ones included). Armed (Arm) with a countdown N, the N-th allocation throws
// std::bad_alloc (a nothrow form returns nullptr), once; g_fired records that it did.
//
// Include from ONE translation unit of an executable of its own (the replacements are
// definitions): tests/CMakeLists.txt gives every test whose name matches KVPACK_SOLO_TEST_REGEX
// ("^test_alloc_fault") its own executable. Single-threaded use only (plain globals).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace {
long g_countdown = 0;  // while armed and > 0: the allocation that brings it to 0 throws (once)
bool g_armed = false;  // counting only inside kvpack calls (single-threaded test)
bool g_fired = false;

void* counted_alloc(std::size_t n) {
  if (g_armed && g_countdown > 0 && --g_countdown == 0) {
    g_fired = true;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

struct Arm {  // counts allocations toward the fault for the scope of one call
  explicit Arm(bool on) { g_armed = on; }
  ~Arm() { g_armed = false; }
  Arm(const Arm&) = delete;
  Arm& operator=(const Arm&) = delete;
};
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (the cache's fit_payload uses one): they count toward the fault like the
// others, and under AddressSanitizer an unreplaced form would come from its allocator while our
// delete frees with std::free (an alloc-dealloc mismatch).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
