// Where the S3 driver finds credentials, region and endpoint, the way AWS tools do.
//
// Credentials, first found wins:
//   1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) from the environment,
//      unless a profile is named explicitly (URL ?profile=...).
//   2. The profile (URL ?profile=..., else AWS_PROFILE, else "default") of the shared
//      credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials), keys
//      aws_access_key_id / aws_secret_access_key / aws_session_token; then the same keys in
//      the profile's section of the config file (AWS_CONFIG_FILE, else ~/.aws/config,
//      section "[profile NAME]" or "[default]").
// Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's `region` in the config file,
// "us-east-1". Endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
// `endpoint_url`; none means AWS (https://s3.<region>.amazonaws.com).
//
// No instance metadata (IMDS), SSO or assume-role: those need network calls we do not make.
// Secrets: AwsCredentials never prints its secret; `source` says where the key came from.
// Thread-safety: pure functions of the environment and files at call time.
#pragma once

#include <optional>
#include <string>

namespace shardpoint::storage::s3 {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;  // secret
  std::string session_token;      // secret; empty when none
  std::string source;             // "environment", "profile \"p\" in /root/.aws/credentials"
  bool empty() const { return access_key_id.empty() || secret_access_key.empty(); }
};

// Resolves credentials as above. `profile`: an explicit profile name ("" = none given).
// Returns empty credentials (empty() true) when none are found; the caller decides whether
// anonymous access is acceptable.
AwsCredentials load_aws_credentials(const std::string& profile = "");

// Region and endpoint as above ("" = not configured).
std::string load_aws_region(const std::string& profile = "");
std::string load_aws_endpoint(const std::string& profile = "");

// The value of `key` in section `section` of an INI file ("" when absent or unreadable).
std::string ini_value(const std::string& path, const std::string& section, const std::string& key);

}  // namespace shardpoint::storage::s3
