#include "storage/s3/aws_credentials.h"

#include <cstdlib>
#include <fstream>

namespace shardpoint::storage::s3 {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string trim(std::string s) {
  std::size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  std::size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string home_file(const char* override_var, const char* relative) {
  std::string path = env(override_var);
  if (!path.empty()) return path;
  std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/" + relative;
}

std::string profile_name(const std::string& profile) {
  if (!profile.empty()) return profile;
  std::string p = env("AWS_PROFILE");
  return p.empty() ? "default" : p;
}

std::string config_section(const std::string& profile) {
  return profile == "default" ? "default" : "profile " + profile;
}

}  // namespace

std::string ini_value(const std::string& path, const std::string& section, const std::string& key) {
  if (path.empty()) return {};
  std::ifstream in(path);
  std::string line;
  bool in_section = false;
  while (std::getline(in, line)) {
    std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      in_section = trim(t.substr(1, t.size() - 2)) == section;
      continue;
    }
    if (!in_section) continue;
    std::size_t eq = t.find('=');
    if (eq == std::string::npos) continue;
    if (trim(t.substr(0, eq)) == key) return trim(t.substr(eq + 1));
  }
  return {};
}

AwsCredentials load_aws_credentials(const std::string& profile) {
  AwsCredentials c;
  if (profile.empty()) {
    c.access_key_id = env("AWS_ACCESS_KEY_ID");
    c.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    if (!c.empty()) {
      c.session_token = env("AWS_SESSION_TOKEN");
      c.source = "environment (AWS_ACCESS_KEY_ID)";
      return c;
    }
  }
  const std::string name = profile_name(profile);
  const std::string files[2][2] = {
      {home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"), name},
      {home_file("AWS_CONFIG_FILE", ".aws/config"), config_section(name)},
  };
  for (const auto& [path, section] : files) {
    c.access_key_id = ini_value(path, section, "aws_access_key_id");
    c.secret_access_key = ini_value(path, section, "aws_secret_access_key");
    if (!c.empty()) {
      c.session_token = ini_value(path, section, "aws_session_token");
      c.source = "profile \"" + name + "\" in " + path;
      return c;
    }
  }
  return AwsCredentials{};
}

std::string load_aws_region(const std::string& profile) {
  for (const char* var : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    std::string v = env(var);
    if (!v.empty()) return v;
  }
  return ini_value(home_file("AWS_CONFIG_FILE", ".aws/config"), config_section(profile_name(profile)), "region");
}

std::string load_aws_endpoint(const std::string& profile) {
  for (const char* var : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    std::string v = env(var);
    if (!v.empty()) return v;
  }
  return ini_value(home_file("AWS_CONFIG_FILE", ".aws/config"), config_section(profile_name(profile)), "endpoint_url");
}

}  // namespace shardpoint::storage::s3
