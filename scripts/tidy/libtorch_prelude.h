// Included first (clang-tidy --extra-arg=-include...) in the units that include LibTorch, for
// clang-tidy only; GCC builds them without it. Debian's LibTorch 1.13 declares
// std::vector<c10::IValue> members while c10::IValue is still incomplete (ATen/core/List.h);
// GCC instantiates the C++20 constexpr members of std::vector lazily, clang eagerly, so clang
// stops with "incomplete type c10::IValue". This declares std::vector itself without constexpr
// (the rest of libstdc++ keeps it), which clang then accepts.
// NOLINTBEGIN(bugprone-reserved-identifier): libstdc++'s own configuration macro.
#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <bits/c++config.h>
#undef _GLIBCXX20_CONSTEXPR
#define _GLIBCXX20_CONSTEXPR
#include <vector>
#undef _GLIBCXX20_CONSTEXPR
#define _GLIBCXX20_CONSTEXPR constexpr
// NOLINTEND(bugprone-reserved-identifier)
