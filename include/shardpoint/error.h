// The one exception hierarchy of shardpoint.
//
// Few types, chosen by what the catcher does with them:
//   FormatError  - bytes are not what the format says (corrupt, truncated, hostile input).
//   StorageError - the storage failed (missing file, permission, full disk, transient).
//   PlanError    - the checkpoint cannot satisfy the request (missing key, shape mismatch).
//   UsageError   - the caller asked for something invalid (bad option, bad URL).
//   CommError    - a collective failed or timed out.
// Messages name the file, the item and what was expected versus found. Context is added
// once, where it is known, with rethrow_with_context().
//
// Thread-safety: exceptions are immutable values; safe to pass across threads as
// std::exception_ptr.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace shardpoint {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class FormatError : public Error {
 public:
  explicit FormatError(const std::string& message) : Error(message) {}
};

class StorageError : public Error {
 public:
  // Existing values may be matched by callers (and cross ranks by number); only add new ones,
  // at the end. kAlreadyExists: a create-only write (storage.h WriteOptions::if_absent) found
  // an object under its key, written by someone else.
  enum class Kind { kNotFound, kPermission, kNoSpace, kTransient, kOther, kAlreadyExists };

  StorageError(Kind kind, const std::string& message) : Error(message), kind_(kind) {}

  Kind kind() const { return kind_; }
  // True when the same call may succeed if repeated (timeouts, 5xx, resets).
  bool retryable() const { return kind_ == Kind::kTransient; }

 private:
  Kind kind_;
};

class PlanError : public Error {
 public:
  explicit PlanError(const std::string& message) : Error(message) {}
};

class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

class CommError : public Error {
 public:
  explicit CommError(const std::string& message) : Error(message) {}
};

// Throws a StorageError for a failed system call: "<op> <path>: <strerror>".
// ENOENT -> kNotFound, EACCES/EPERM -> kPermission, ENOSPC/EDQUOT -> kNoSpace,
// EINTR/EAGAIN/ETIMEDOUT -> kTransient, anything else -> kOther.
[[noreturn]] void throw_os_error(const std::string& op, const std::string& path, int err);

// Rethrows the in-flight exception (REQUIRES: called inside a catch block) with
// "<context>: " prefixed to its message, keeping its type.
[[noreturn]] void rethrow_with_context(const std::string& context);

}  // namespace shardpoint
