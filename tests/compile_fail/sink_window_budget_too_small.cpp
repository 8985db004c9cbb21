// expect: the budget N must exceed the S sinks
#include <kvpack/kvpack.hpp>
using Bad = kvpack::KVCache<kvpack::SinkWindowBudget<kvpack::Tokens<4>, 4>>;
int main() { return Bad::create({}).has_value() ? 0 : 1; }
