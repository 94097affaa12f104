#include "shardpoint/error.h"

#include <cerrno>
#include <cstring>

namespace shardpoint {

void throw_os_error(const std::string& op, const std::string& path, int err) {
  using Kind = StorageError::Kind;
  Kind kind = Kind::kOther;
  switch (err) {
    case ENOENT: kind = Kind::kNotFound; break;
    case EACCES:
    case EPERM: kind = Kind::kPermission; break;
    case ENOSPC:
    case EDQUOT: kind = Kind::kNoSpace; break;
    case EINTR:
    case EAGAIN:
    case ETIMEDOUT: kind = Kind::kTransient; break;
    default: break;
  }
  throw StorageError(kind, op + " " + path + ": " + std::strerror(err));
}

void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (const FormatError& e) {
    throw FormatError(context + ": " + e.what());
  } catch (const StorageError& e) {
    throw StorageError(e.kind(), context + ": " + e.what());
  } catch (const PlanError& e) {
    throw PlanError(context + ": " + e.what());
  } catch (const UsageError& e) {
    throw UsageError(context + ": " + e.what());
  } catch (const CommError& e) {
    throw CommError(context + ": " + e.what());
  } catch (const Error& e) {
    throw Error(context + ": " + e.what());
  }
}

}  // namespace shardpoint
