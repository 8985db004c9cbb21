// Consumer of kvpack through find_package. Includes the umbrella header once it exists on main
// (TODO: include only <kvpack/kvpack.hpp> then); until then the two headers that do.
#if __has_include(<kvpack/kvpack.hpp>)
#include <kvpack/kvpack.hpp>
#endif
#include <kvpack/config.hpp>
#include <kvpack/result.hpp>

#if defined(KVPACK_HAS_SODIUM)
#include <sodium.h>
constexpr bool kWithSodium = true;
#else
constexpr bool kWithSodium = false;
#endif

#include <cstdio>

namespace {
kvpack::Result<int> half(int x) {
  if (x % 2 != 0) return kvpack::fail(kvpack::Errc::invalid_argument, "odd input");
  return x / 2;
}
}  // namespace

int main() {
  const auto ok = half(42);
  const auto bad = half(3);
  if (!ok || *ok != 21 || bad || bad.error().code != kvpack::Errc::invalid_argument) return 1;
#if defined(KVPACK_HAS_SODIUM)
  if (sodium_init() < 0) return 1;  // libsodium links through kvpack::offload
#endif
  std::printf("find_package consumer ok (libsodium: %s)\n", kWithSodium ? "yes" : "no");
  return 0;
}
