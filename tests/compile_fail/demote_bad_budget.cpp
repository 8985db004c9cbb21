// expect: Budget must be Tokens<N>, Fraction<Num, Den>, Fp16Share<Num, Den> or Unbounded
// The low tier's budget is a token count, a fraction of max_tokens or a share of fp16 bytes;
// a bare number (here an int constant type) is none of them.
#include <kvpack/kvpack.hpp>

#include <type_traits>

using Bad = kvpack::KVCache<kvpack::Keys<kvpack::Int4<>>, kvpack::Values<kvpack::Int4<>>, kvpack::SinkWindow<4, 60>,
                            kvpack::Demote<kvpack::Keys<kvpack::Int2<>>, kvpack::Values<kvpack::Int2<>>,
                                           std::integral_constant<int, 512>>>;
static_assert(Bad::demotes);
int main() { return 0; }
