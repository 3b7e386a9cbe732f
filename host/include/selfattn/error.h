#pragma once
#include <stdexcept>
#include <string>

namespace selfattn {

// Base of every exception the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad argument: the message names the argument, what was expected and what was given.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A path, dtype/head_dim combination or backend that this build or machine does not provide.
class NotAvailable : public Error {
 public:
  using Error::Error;
};

// The workspace limit is too small for even one chunk of the work (one query row; see
// ContextOptions::workspace_limit for what is counted); the message names the limit.
class WorkspaceTooSmall : public Error {
 public:
  using Error::Error;
};

// A CUDA, cuBLAS or sim failure; the message names the call that failed.
class BackendError : public Error {
 public:
  using Error::Error;
};

}  // namespace selfattn
