#pragma once
// Small helpers for the host tests: error checks by type and message, poisoned buffers.
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/selfattn.h"

namespace selfattn::host_test {

// Runs f; passes when it throws E whose message contains every one of `parts`.
template <class E, class F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
  } catch (const E& e) {
    const std::string message = e.what();
    for (const char* part : parts) {
      if (message.find(part) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another type: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

constexpr unsigned char kPoison = 0xAB;

// Every byte of the buffer still holds the poison pattern.
template <class T>
::testing::AssertionResult untouched(const DeviceBuffer<T>& buffer) {
  std::vector<T> host = buffer.to_host();
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  for (size_t i = 0; i < host.size() * sizeof(T); ++i) {
    if (bytes[i] != kPoison) return ::testing::AssertionFailure() << "byte " << i << " was written";
  }
  return ::testing::AssertionSuccess();
}

// Unsets SELFATTN_BACKEND for the test's duration (a developer's shell may set it).
struct ScopedBackendVariable {
  explicit ScopedBackendVariable(const char* value) {
    if (const char* old = std::getenv("SELFATTN_BACKEND")) saved = old, had = true;
    if (value) setenv("SELFATTN_BACKEND", value, 1); else unsetenv("SELFATTN_BACKEND");
  }
  ~ScopedBackendVariable() {
    if (had) setenv("SELFATTN_BACKEND", saved.c_str(), 1); else unsetenv("SELFATTN_BACKEND");
  }
  std::string saved;
  bool had = false;
};

}  // namespace selfattn::host_test
