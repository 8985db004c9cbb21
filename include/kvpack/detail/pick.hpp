// Compile-time helpers that find a policy by its role inside a parameter pack.
#pragma once

#include <type_traits>

namespace kvpack::detail {

/// Number of types in Ts... satisfying Pred.
template <template <class> class Pred, class... Ts>
inline constexpr int count_if_v = (0 + ... + (Pred<Ts>::value ? 1 : 0));

template <template <class> class Pred, class Default, class... Ts>
struct pick_or;
template <template <class> class Pred, class Default>
struct pick_or<Pred, Default> {
  using type = Default;
};
template <template <class> class Pred, class Default, class T, class... Ts>
struct pick_or<Pred, Default, T, Ts...> {
  using type = std::conditional_t<Pred<T>::value, T, typename pick_or<Pred, Default, Ts...>::type>;
};
/// The first type in Ts... satisfying Pred, or Default when there is none.
template <template <class> class Pred, class Default, class... Ts>
using pick_or_t = typename pick_or<Pred, Default, Ts...>::type;

/// Adapts a constexpr bool variable template to a class template predicate.
template <class T, template <class> class... Preds>
inline constexpr bool any_of_v = (false || ... || Preds<T>::value);

}  // namespace kvpack::detail
