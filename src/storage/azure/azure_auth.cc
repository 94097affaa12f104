#include "storage/azure/azure_auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>

#include "shardpoint/error.h"

namespace shardpoint::storage::azure {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::string getenv_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string hmac_sha256_base64(std::string_view key_base64, std::string_view message) {
  std::string key = base64_decode(key_base64, "the Azure account key");
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_len) == nullptr) {
    throw StorageError(StorageError::Kind::kOther, "azure: HMAC-SHA256 failed (OpenSSL)");
  }
  return base64_encode(std::string_view(reinterpret_cast<const char*>(mac), mac_len));
}

int env_int(const char* name, int fallback) {
  std::string v = getenv_string(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 0 || n > 1000000) {
    throw UsageError(std::string(name) + "=\"" + v + "\": expected a non-negative integer");
  }
  return static_cast<int>(n);
}

}  // namespace

std::string AzureConfig::describe() const {
  if (!account_key.empty()) return "SharedKey for account \"" + account + "\"";
  if (!sas_token.empty()) return "SAS for account \"" + account + "\"";
  return "anonymous access to account \"" + account + "\"";
}

std::string base64_decode(std::string_view text, std::string_view what) {
  std::optional<std::string> bytes = shardpoint::base64_decode(trim(text));
  if (!bytes) throw UsageError("invalid base64 in " + std::string(what));
  return *std::move(bytes);
}

std::string uri_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

AzureConfig parse_connection_string(std::string_view connection_string) {
  AzureConfig config;
  std::string_view rest = connection_string;
  std::size_t index = 0;
  while (!rest.empty()) {
    std::size_t semi = rest.find(';');
    std::string_view part = rest.substr(0, semi);
    rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
    ++index;
    if (trim(part).empty()) continue;
    std::size_t eq = part.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      // Never echo the part: it may be (a piece of) a secret.
      throw UsageError("AZURE_STORAGE_CONNECTION_STRING: part " + std::to_string(index) +
                       " is not key=value (expected \"AccountName=..;AccountKey=..;BlobEndpoint=..\")");
    }
    std::string key = lower(trim(part.substr(0, eq)));
    std::string value = trim(part.substr(eq + 1));
    if (key == "accountname") {
      config.account = value;
    } else if (key == "accountkey") {
      config.account_key = value;
    } else if (key == "sharedaccesssignature") {
      config.sas_token = value.starts_with("?") ? value.substr(1) : value;
    } else if (key == "blobendpoint") {
      while (value.ends_with("/")) value.pop_back();
      config.blob_endpoint = value;
    } else if (key == "defaultendpointsprotocol") {
      config.protocol = lower(value);
    } else if (key == "endpointsuffix") {
      config.endpoint_suffix = value;
    } else if (key == "usedevelopmentstorage" && lower(value) == "true") {
      // Azurite's well-known account (public, documented by Microsoft).
      config.account = "devstoreaccount1";
      config.account_key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
      config.blob_endpoint = "http://127.0.0.1:10000/devstoreaccount1";
    }
  }
  if (!config.account_key.empty()) base64_decode(config.account_key, "AZURE_STORAGE_CONNECTION_STRING AccountKey");
  return config;
}

AzureConfig azure_config_from_env() {
  AzureConfig config;
  std::string cs = getenv_string("AZURE_STORAGE_CONNECTION_STRING");
  if (!cs.empty()) {
    config = parse_connection_string(cs);
  } else {
    config.account = getenv_string("AZURE_STORAGE_ACCOUNT");
    config.account_key = getenv_string("AZURE_STORAGE_KEY");
    if (config.account_key.empty()) config.account_key = getenv_string("AZURE_STORAGE_ACCESS_KEY");
    std::string sas = getenv_string("AZURE_STORAGE_SAS_TOKEN");
    config.sas_token = sas.starts_with("?") ? sas.substr(1) : sas;
    if (!config.account_key.empty()) base64_decode(config.account_key, "AZURE_STORAGE_KEY");
  }
  std::string endpoint = getenv_string("AZURE_STORAGE_BLOB_ENDPOINT");
  if (!endpoint.empty()) {
    while (endpoint.ends_with("/")) endpoint.pop_back();
    config.blob_endpoint = endpoint;
  }
  config.max_attempts = std::max(1, env_int("SHARDPOINT_AZURE_MAX_ATTEMPTS", config.max_attempts));
  config.backoff_base =
      std::chrono::milliseconds(env_int("SHARDPOINT_AZURE_BACKOFF_MS", static_cast<int>(config.backoff_base.count())));
  config.backoff_max = std::chrono::milliseconds(
      env_int("SHARDPOINT_AZURE_BACKOFF_MAX_MS", static_cast<int>(config.backoff_max.count())));
  return config;
}

std::string shared_key_authorization(const AzureConfig& config, const SignedRequest& request) {
  auto header = [&](std::string_view name) -> std::string {
    for (const auto& [k, v] : request.headers) {
      if (lower(k) == name) return v;
    }
    return {};
  };
  std::string s = request.method + "\n";
  s += header("content-encoding") + "\n";
  s += header("content-language") + "\n";
  s += (request.content_length == 0 ? std::string() : std::to_string(request.content_length)) + "\n";
  s += header("content-md5") + "\n";
  s += header("content-type") + "\n";
  s += header("date") + "\n";
  s += header("if-modified-since") + "\n";
  s += header("if-match") + "\n";
  s += header("if-none-match") + "\n";
  s += header("if-unmodified-since") + "\n";
  s += header("range") + "\n";
  std::vector<std::pair<std::string, std::string>> ms;
  for (const auto& [k, v] : request.headers) {
    std::string name = lower(k);
    if (name.starts_with("x-ms-")) ms.emplace_back(name, trim(v));
  }
  std::sort(ms.begin(), ms.end());
  for (const auto& [k, v] : ms) s += k + ":" + v + "\n";
  s += "/" + config.account + request.path;
  std::vector<std::pair<std::string, std::string>> query;
  for (const auto& [k, v] : request.query) query.emplace_back(lower(k), v);
  std::sort(query.begin(), query.end());
  for (std::size_t i = 0; i < query.size();) {
    std::string values = query[i].second;
    std::size_t j = i + 1;
    for (; j < query.size() && query[j].first == query[i].first; ++j) values += "," + query[j].second;
    s += "\n" + query[i].first + ":" + values;
    i = j;
  }
  return "SharedKey " + config.account + ":" + hmac_sha256_base64(config.account_key, s);
}

std::string make_account_sas(const AzureConfig& config, std::string_view permissions, std::string_view expiry) {
  const std::string version = "2020-12-06";
  std::string to_sign = config.account + "\n" + std::string(permissions) + "\nb\nsco\n\n" + std::string(expiry) +
                        "\n\n\n" + version + "\n\n";
  return "sv=" + version + "&ss=b&srt=sco&sp=" + std::string(permissions) + "&se=" + uri_encode(expiry, false) +
         "&sig=" + uri_encode(hmac_sha256_base64(config.account_key, to_sign), false);
}

std::string make_container_sas(const AzureConfig& config, std::string_view container, std::string_view permissions,
                               std::string_view expiry) {
  const std::string version = "2020-12-06";
  std::string resource = "/blob/" + config.account + "/" + std::string(container);
  // sp, st, se, resource, si, sip, spr, sv, sr, snapshot, ses, rscc, rscd, rsce, rscl, rsct
  std::string to_sign = std::string(permissions) + "\n\n" + std::string(expiry) + "\n" + resource + "\n\n\n\n" +
                        version + "\nc\n\n\n\n\n\n\n";
  return "sv=" + version + "&sr=c&sp=" + std::string(permissions) + "&se=" + uri_encode(expiry, false) +
         "&sig=" + uri_encode(hmac_sha256_base64(config.account_key, to_sign), false);
}

}  // namespace shardpoint::storage::azure
